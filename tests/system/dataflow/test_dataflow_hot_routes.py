"""Leases, submissions and heartbeats are answered without the web framework
(``dataflow/hotpath.py``): a node must not be able to tell. The same conversation --
good calls and every kind of bad one -- goes to a data layer with the fast path and to
one without it, and every answer must match: status, reply and error text."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgpack
from dataflow_helpers import TOKEN, make_trajectory

from astraflow.dataflow.client import SOCKET_OPTIONS

AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_ = {**AUTH, "Content-Type": "application/json"}
PACKED = {**AUTH, "Content-Type": "application/msgpack", "Accept": "application/msgpack"}


def _conversation(lease_id: str | None) -> list[tuple[str, bytes, dict[str, str]]]:
    """(path, body, headers) of every call after registration, in order."""
    traj = make_trajectory("x").to_dict()
    calls = [
        ("/v1/nodes/n1/heartbeat", b"", AUTH),
        ("/v1/nodes/n1/heartbeat", b"", PACKED),
        ("/v1/nodes/ghost/heartbeat", b"", AUTH),            # 404: never registered
        ("/v1/nodes/bad%20id/heartbeat", b"", AUTH),         # 422: not a node id
        ("/v1/leases", b"", {}),                             # 401: no token
        ("/v1/leases", b"{}", {"Authorization": "Bearer wrong"}),  # 401: wrong token
        ("/v1/leases", b"{not json", JSON_),                 # 400
        ("/v1/leases", b"\xc1", {**AUTH, "Content-Type": "application/msgpack"}),  # 400
        ("/v1/leases", b"node_id=n1", {**AUTH, "Content-Type": "text/plain"}),   # 415
        ("/v1/leases", b'{"node_id": "n 1"}', JSON_),        # 422: names the field
        ("/v1/leases", b"", JSON_),                          # 422: no node id
        ("/v1/leases", b"x" * 5000, JSON_),                  # 413: over the limit
        ("/v1/trajectories", json.dumps({"lease_id": "nope|1", "trajectories": [traj]})
         .encode(), JSON_),                                  # 4xx: no such lease
        ("/v1/trajectories", b'{"lease_id": "a|1"}', JSON_),  # 422: no trajectories
    ]
    if lease_id is not None:
        task = lease_id.split("|")[0]
        good = {"lease_id": lease_id, "trajectories": [make_trajectory(task).to_dict()]}
        calls += [("/v1/trajectories", msgpack.packb(good), PACKED),  # accepted
                  ("/v1/trajectories", msgpack.packb(good), PACKED)]  # the same again
    return calls


def _answer(resp: httpx.Response) -> tuple[int, Any, str]:
    media = resp.headers.get("content-type", "")
    body = msgpack.unpackb(resp.content) if "msgpack" in media else resp.json()
    if isinstance(body, dict):  # what changes between two servers
        body = {k: v for k, v in body.items() if k not in ("versions", "leases")}
    return resp.status_code, body, resp.headers.get("www-authenticate", "")


def _talk(tmp_path, hot: bool) -> list[tuple[int, Any, str]]:
    from astraflow.dataflow.server import BackgroundServer
    from astraflow.dataflow.settings import DataflowSettings

    settings = DataflowSettings(store=str(tmp_path / ("hot" if hot else "framework")),
                                max_body_bytes=4096, hot_routes=hot)
    with BackgroundServer(settings, TOKEN) as srv, httpx.Client(
            base_url=srv.url, timeout=10,
            transport=httpx.HTTPTransport(socket_options=SOCKET_OPTIONS)) as http:
        http.post("/v1/nodes", headers=AUTH,
                  json={"kind": "raas", "node_id": "n1",
                        "labels": {"pool": "p", "capacity": 2}}).raise_for_status()
        http.post("/v1/tasks", headers=AUTH, json={"tasks": [
            {"task_id": "t1", "prompt": "1+1=", "answer": "2"}]}).raise_for_status()
        leased = http.post("/v1/leases", headers=AUTH,
                           json={"node_id": "n1", "max_tasks": 1, "wait": 5})
        leases = leased.json()["leases"]
        answers = [(leased.status_code, len(leases), "")]
        lease_id = leases[0]["lease_id"] if leases else None
        for path, body, headers in _conversation(lease_id):
            answers.append(_answer(http.post(path, content=body, headers=headers)))
        return answers


def test_the_fast_path_answers_exactly_as_the_framework_does(tmp_path):
    hot, framework = _talk(tmp_path, True), _talk(tmp_path, False)
    assert hot[0] == (200, 1, ""), "the node was leased no task"
    statuses = [a[0] for a in hot[1:]]
    assert statuses[:12] == [200, 200, 404, 422, 401, 401, 400, 400, 415, 422, 422, 413]
    assert statuses[12] // 100 == 4 and statuses[13] == 422
    assert statuses[14:] == [200, 200]
    assert hot[15][1]["accepted"] == 1 and hot[16][1]["status"] == "duplicate"  # once
    for k, (a, b) in enumerate(zip(hot, framework, strict=True)):
        assert a == b, f"call {k} answered differently: fast path {a}, framework {b}"

