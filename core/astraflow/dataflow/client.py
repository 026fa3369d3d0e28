"""Clients of the data layer: :class:`DataflowClient` (sync, trainers) and
:class:`AsyncDataflowClient` (asyncio, RaaS nodes).

Both speak msgpack and retry connection errors, 429 and 5xx with exponential backoff
(for up to ``retry_for`` seconds), so a node or trainer rides through a data-layer
restart by itself. Retrying is safe because every call is idempotent on the server:
a resubmitted task answers "duplicate", a re-asked batch is the same batch, a
repeated ack or version announcement changes nothing.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import msgpack

from astraflow.dataflow.wire import (
    MSGPACK,
    Lease,
    batch_from_wire,
    encode_trajectory,
)
from astraflow.types import Task, Trajectory


class DataflowError(Exception):
    """The data layer refused a request; ``detail`` says why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass
class _Call:
    method: str
    path: str
    body: Any = None
    timeout: float | None = None
    parse: Callable[[Any], Any] = lambda data: data
    #: issued once if the call answers 404 (e.g. re-register a retired node), then retried
    recover: _Call | None = None


#: small requests must not wait for a delayed ACK (Nagle) between headers and body
SOCKET_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
#: idle connections an asyncio client keeps open for reuse
KEEPALIVE_CONNECTIONS = 8


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _advance(steps: Generator[tuple[str, Any], Any, Any], reply: Any) -> tuple[str, Any]:
    """The next step of :meth:`_Api._steps`, or ("done", result)."""
    try:
        return steps.send(reply)
    except StopIteration as stop:
        return "done", stop.value


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (JSON and the data layer take no NaN)."""
    return {str(k): float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _backoff(attempt: int) -> float:
    return float(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random() / 2))


class _Api:
    """The calls, described once; subclasses decide how to send them."""

    def __init__(self, url: str, token: str, timeout: float, retry_for: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for = retry_for
        #: every body is msgpack: one default header, not one merged into each request
        self.headers = {"Authorization": f"Bearer {token}", "Accept": MSGPACK,
                        "Content-Type": MSGPACK}
        self.node_id: str | None = None
        self.backpressure: dict[str, str] = {}
        #: the data layer's pacing hint from the last lease: tasks_per_second (this
        #: node's share of what the trainers consume) and turnaround_seconds
        self.pace: dict[str, Any] = {}
        #: the heartbeat interval the data layer advised (it grows with the pool)
        self.heartbeat_interval: float | None = None
        #: when a lease or a submission last reached the data layer (monotonic): the
        #: data layer counts each as a heartbeat
        self.heard_at = float("-inf")
        #: seconds the data layer asked this node to wait before asking for leases
        #: again, when it refused the last ones as overloaded (None: ask when free)
        self.overloaded_retry: float | None = None
        self._registration: dict[str, Any] | None = None

    def _do(self, call: _Call) -> Any:
        raise NotImplementedError

    def _steps(self, call: _Call) -> Generator[tuple[str, Any], Any, Any]:
        """One call with its retries, for either client to drive (see :func:`_advance`):
        yields ("send", call) and is sent the response or the transport error, yields
        ("do", call) for a call to make first (re-registering a node the data layer
        forgot) and ("sleep", seconds) between attempts; returns the parsed result."""
        give_up = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            reply = yield "send", call
            if isinstance(reply, httpx.Response):
                if reply.status_code == 404 and call.recover is not None:
                    yield "do", call.recover
                    call.recover = None
                    continue
                if not _retryable(reply.status_code):
                    if reply.status_code >= 400:
                        raise self._error(reply)
                    return call.parse(self._decode(reply))
                reply = self._error(reply)
            if time.monotonic() > give_up:
                raise reply
            yield "sleep", _backoff(attempt)
            attempt += 1

    @staticmethod
    def _decode(resp: httpx.Response) -> Any:
        if resp.status_code == 204:
            return None
        if MSGPACK in resp.headers.get("content-type", ""):
            return msgpack.unpackb(resp.content)
        return resp.json() if resp.content else None

    @classmethod
    def _error(cls, resp: httpx.Response) -> DataflowError:
        try:
            detail = cls._decode(resp)["detail"]
        except Exception:
            detail = resp.text[:500]
        return DataflowError(resp.status_code, str(detail))

    def _content(self, call: _Call) -> dict[str, Any]:
        if call.body is None:
            return {}
        return {"content": msgpack.packb(call.body)}

    @staticmethod
    def _timeout(call: _Call) -> dict[str, Any]:
        """The call's own timeout; none given, the client's default applies."""
        return {} if call.timeout is None else {"timeout": call.timeout}

    def _node(self, node_id: str | None) -> str:
        node = node_id or self.node_id
        if node is None:
            raise ValueError("register first, or pass node_id")
        return node

    # ---- nodes -----------------------------------------------------------------------

    def register(self, kind: str, *, pool: str = "default", region: str = "local",
                 policies: Sequence[str] = (), capacity: int = 1,
                 node_id: str | None = None) -> Any:
        """Register a ``"raas"`` node or a ``"trainer"``; returns its node id.

        The id is chosen here (unless given) so a retried registration is the same node.
        """
        node_id = node_id or f"{kind}-{uuid.uuid4().hex[:12]}"
        body = {"kind": kind, "node_id": node_id,
                "labels": {"pool": pool, "region": region, "policies": list(policies),
                           "capacity": capacity}}
        self._registration = body

        def remember(data: dict[str, Any]) -> str:
            self.node_id = data["node_id"]
            self.heartbeat_interval = data.get("heartbeat_interval", self.heartbeat_interval)
            return self.node_id

        return self._do(_Call("POST", "/v1/nodes", body, parse=remember))

    def heartbeat(self, node_id: str | None = None) -> Any:
        """Keep the node alive; a node retired meanwhile registers again by itself."""
        node = self._node(node_id)
        recover = None
        if self._registration is not None and self._registration["node_id"] == node:
            recover = _Call("POST", "/v1/nodes", self._registration)

        def advice(data: dict[str, Any]) -> Any:
            self.heard_at = time.monotonic()
            self.heartbeat_interval = data.get("heartbeat_interval", self.heartbeat_interval)
            return data

        return self._do(_Call("POST", f"/v1/nodes/{node}/heartbeat", recover=recover,
                              parse=advice))

    def leave(self, node_id: str | None = None) -> Any:
        """Leave cleanly; leases still held are re-issued to other nodes."""
        return self._do(_Call("DELETE", f"/v1/nodes/{self._node(node_id)}"))

    # ---- tasks and trajectories ------------------------------------------------------

    def lease_tasks(self, node_id: str | None = None, max_tasks: int = 1, wait: float = 0.0,
                    versions: dict[str, int] | None = None) -> Any:
        """Up to ``max_tasks`` leases (list of :class:`Lease`), waiting up to ``wait`` s.

        An empty list means backpressure or no work: ``self.backpressure`` says which.
        ``versions`` are the weight versions the node holds (default: the latest).
        """
        body = {"node_id": self._node(node_id), "max_tasks": max_tasks, "wait": wait,
                "versions": versions or {}}

        def leases(data: dict[str, Any]) -> list[Lease]:
            self.heard_at = time.monotonic()
            self._lease_reply(data)
            return [Lease.from_wire(x) for x in data["leases"]]

        return self._do(_Call("POST", "/v1/leases", body, timeout=wait + self.timeout,
                              parse=leases))

    def submit(self, lease: Lease | str, trajectories: Sequence[Trajectory | dict[str, Any]],
               node_id: str | None = None, lease_more: int = 0,
               versions: dict[str, int] | None = None) -> Any:
        """Submit all trajectories of a leased task; ``status`` is accepted or duplicate.

        Dicts are taken as already in wire form (see ``wire.encode_trajectory``). With
        ``lease_more`` the same round trip leases up to that many more tasks (without
        waiting), returned as ``leases`` (list of :class:`Lease`), like
        :meth:`lease_tasks` with the weight ``versions`` the node holds.
        """
        return self.submit_body(self.submission(lease, trajectories, node_id, lease_more,
                                                versions))

    def submit_body(self, body: dict[str, Any]) -> Any:
        """:meth:`submit` of a :meth:`submission` body."""
        return self._do(_Call("POST", "/v1/trajectories", body, parse=self._submitted))

    def submission(self, lease: Lease | str,
                   trajectories: Sequence[Trajectory | dict[str, Any]],
                   node_id: str | None = None, lease_more: int = 0,
                   versions: dict[str, int] | None = None) -> dict[str, Any]:
        """The body of :meth:`submit`, the unit :meth:`submit_many` sends several of."""
        body: dict[str, Any] = {
            "lease_id": lease if isinstance(lease, str) else lease.lease_id,
            "node_id": node_id or self.node_id,
            "trajectories": [t if isinstance(t, dict) else encode_trajectory(t)
                             for t in trajectories],
        }
        if lease_more:
            body["lease"] = {"max_tasks": lease_more, "versions": versions or {}}
        return body

    def submit_many(self, submissions: Sequence[dict[str, Any]]) -> Any:
        """Several :meth:`submission` bodies in one round trip; a list answering each in
        order, as :meth:`submit` would, or with a :class:`DataflowError` for one the
        data layer refused (the others are not refused with it)."""

        def parse(data: dict[str, Any]) -> list[Any]:
            return [DataflowError(int(r["status_code"]), str(r["error"])) if "error" in r
                    else self._submitted(r) for r in data["results"]]

        return self._do(_Call("POST", "/v1/trajectories/many",
                              {"submissions": list(submissions)}, parse=parse))

    def _lease_reply(self, data: dict[str, Any]) -> None:
        """What a reply that leases (a lease, a submission asking for more) says besides
        the leases: backpressure, pace, and when to ask again if it was overloaded."""
        self.overloaded_retry = data.get("retry_after") if data.get("overloaded") else None
        self.backpressure = data.get("backpressure", {})
        self.pace = data.get("pace", self.pace)

    def _submitted(self, data: dict[str, Any]) -> dict[str, Any]:
        self.heard_at = time.monotonic()
        if "leases" in data:
            self._lease_reply(data)
            data["leases"] = [Lease.from_wire(x) for x in data["leases"]]
        return data

    def post_tasks(self, tasks: Sequence[Task]) -> Any:
        """Queue extra tasks (idempotent by task id)."""
        return self._do(_Call("POST", "/v1/tasks", {"tasks": [asdict(t) for t in tasks]}))

    # ---- batches and versions --------------------------------------------------------

    def get_batch(self, policy: str, n: int, timeout: float = 30.0,
                  trainer_id: str = "trainer", after: str | None = None) -> Any:
        """A :class:`Batch` of ``n`` for ``policy``, or None after ``timeout`` s.

        Keep ``trainer_id`` stable across restarts: an unacknowledged batch is served
        again to the same trainer id. ``after``: the id of a batch held unacknowledged,
        to fetch the next while training on it (two at most).
        """
        body: dict[str, Any] = {"policy": policy, "n": n, "timeout": timeout,
                                "trainer_id": trainer_id}
        if after is not None:
            body["after"] = after
        return self._do(_Call("POST", "/v1/batches", body, timeout=timeout + self.timeout,
                              parse=lambda d: None if d is None else batch_from_wire(d)))

    def ack_batch(self, batch_id: str, wait_seconds: float = 0.0,
                  step_seconds: float = 0.0, metrics: dict[str, float] | None = None,
                  steps_left: int | None = None) -> Any:
        """Acknowledge after the train step; ``step_seconds`` includes ``wait_seconds``;
        ``metrics``: the step's numbers for the dashboard (finite ones are sent);
        ``steps_left``: the steps still to take, so no task is issued beyond them."""
        body: dict[str, Any] = {"wait_seconds": wait_seconds, "step_seconds": step_seconds}
        if steps_left is not None:
            body["steps_left"] = steps_left
        if metrics:
            body["metrics"] = _finite(metrics)
        return self._do(_Call("POST", f"/v1/batches/{batch_id}/ack", body))

    def report_eval(self, policy: str, version: int, metrics: dict[str, float]) -> Any:
        """Held-out scores of ``policy`` at ``version``, for the dashboard."""
        return self._do(_Call("POST", "/v1/evals", {"policy": policy, "version": version,
                                                    "metrics": _finite(metrics)}))

    def announce_version(self, policy: str, version: int) -> Any:
        return self._do(_Call("POST", "/v1/versions", {"policy": policy, "version": version}))

    def versions(self) -> Any:
        return self._do(_Call("GET", "/v1/versions"))

    def wait_versions(self, have: dict[str, int], wait: float) -> Any:
        """Every policy's latest version once one in ``have`` is newer than given there,
        or after ``wait`` s (a long-poll: no polling for new weights)."""
        return self._do(_Call("POST", "/v1/versions/wait", {"have": have, "wait": wait},
                              timeout=wait + self.timeout))

    def status(self) -> Any:
        return self._do(_Call("GET", "/v1/status"))

    def autoscale(self) -> Any:
        return self._do(_Call("GET", "/v1/autoscale"))

    def health(self) -> Any:
        return self._do(_Call("GET", "/v1/health"))


class DataflowClient(_Api):
    """Blocking client (trainers, scripts). Every method returns its result directly."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0,
                 retry_for: float = 300.0) -> None:
        super().__init__(url, token, timeout, retry_for)
        self._http = httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout,
                                  transport=httpx.HTTPTransport(socket_options=SOCKET_OPTIONS))

    def _send(self, call: _Call) -> httpx.Response | httpx.TransportError:
        try:
            return self._http.request(call.method, call.path, **self._timeout(call),
                                      **self._content(call))
        except httpx.TransportError as exc:
            return exc

    def _do(self, call: _Call) -> Any:
        steps, reply = self._steps(call), None
        actions: dict[str, Callable[[Any], Any]] = {
            "send": self._send, "do": self._do, "sleep": time.sleep}
        while (step := _advance(steps, reply))[0] != "done":
            reply = actions[step[0]](step[1])
        return step[1]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DataflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncDataflowClient(_Api):
    """asyncio client (RaaS nodes): the same methods as :class:`DataflowClient`, awaited."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0,
                 retry_for: float = 300.0) -> None:
        super().__init__(url, token, timeout, retry_for)
        # few idle connections kept: the pool checks each of its connections on every
        # request, so one kept per rollout in flight (64 and more) made the HTTP client a
        # third of a node's time; a burst still opens what it needs (never queued behind
        # a long-poll)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=self.headers, timeout=timeout,
            transport=httpx.AsyncHTTPTransport(
                socket_options=SOCKET_OPTIONS,
                limits=httpx.Limits(max_connections=None,
                                    max_keepalive_connections=KEEPALIVE_CONNECTIONS)),
        )

    async def _send(self, call: _Call) -> httpx.Response | httpx.TransportError:
        try:
            return await self._http.request(call.method, call.path, **self._timeout(call),
                                            **self._content(call))
        except httpx.TransportError as exc:
            return exc

    async def _do(self, call: _Call) -> Any:
        steps, reply = self._steps(call), None
        actions: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "send": self._send, "do": self._do, "sleep": asyncio.sleep}
        while (step := _advance(steps, reply))[0] != "done":
            reply = await actions[step[0]](step[1])
        return step[1]

    async def gone(self, timeout: float = 2.0) -> bool:
        """Whether nothing listens at the data layer's address any more: a connection
        refused, asked once and without the retries of every other call. A timeout or an
        error reply is not "gone" (a data layer that is busy, or restarting)."""
        try:
            await self._http.get("/v1/health", timeout=timeout)
        except httpx.ConnectError:
            return True
        except httpx.HTTPError:
            return False
        return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncDataflowClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
