"""Light simulated nodes: a rollout node's wire calls and nothing else.

A whole node runtime (``RaaSNode``: its HTTP client, weight catch-up, metrics) costs its
process so much CPU that a thousand of them saturate two cores before the data layer
does. A light node speaks the same protocol -- register, lease, submit a group with the
next lease asked for in the same round trip (``lease_more``), a heartbeat only when no
other call reached the data layer within the interval it advised, an empty lease's
``retry_after`` honoured -- over one keep-alive HTTP/1.1 connection written here on
asyncio streams (an HTTP client library costs more CPU a request than the data layer
spends answering it).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgpack
import numpy as np

MSGPACK = "application/msgpack"

_GROUP: list[dict[str, Any]] = []


def light_group(task_id: str, group_size: int, policy: str = "policy"
                ) -> list[dict[str, Any]]:
    """A group of 16-token trajectories of the task, in wire form (made once)."""
    if not _GROUP:
        mask = np.r_[np.zeros(8), np.ones(8)].astype(np.uint8).tobytes()
        versions = np.r_[np.full(8, -1), np.zeros(8)].astype("<i4").tobytes()
        _GROUP.extend({
            "policy": policy, "tokens": np.arange(1, 17, dtype="<i4").tobytes(),
            "logprobs": np.full(16, -0.5, dtype="<f4").tobytes(), "loss_mask": mask,
            "versions": versions,
            "spans": [{"start": 0, "end": 8, "source": "prompt", "version": -1},
                      {"start": 8, "end": 16, "source": "policy", "version": 0}],
            "reward": float(k % 2), "metadata": {"sample": k}} for k in range(group_size))
    return [{**t, "task_id": task_id, "group_id": f"{task_id}/{policy}"} for t in _GROUP]


class Wire:
    """One keep-alive HTTP/1.1 connection, msgpack both ways; calls take turns on it."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = (f"Host: {self.host}:{self.port}\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: {MSGPACK}\r\nAccept: {MSGPACK}\r\n")
        self.lock = asyncio.Lock()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        #: when a call last reached the data layer (monotonic)
        self.last_ok = 0.0
        #: connections opened (a keep-alive one the server closed is opened again)
        self.connects = 0

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = b"" if body is None else msgpack.packb(body)
        request = (f"{method} {path} HTTP/1.1\r\n{self.head}Content-Length: {len(data)}"
                   "\r\n\r\n").encode() + data
        async with self.lock:
            for attempt in range(2):  # a connection the server closed: once more, anew
                try:
                    if self.writer is None:
                        self.connects += 1
                        self.reader, self.writer = await asyncio.open_connection(
                            self.host, self.port)
                    assert self.reader is not None
                    self.writer.write(request)
                    status = int((await self.reader.readline()).split()[1])
                    length, close = 0, False
                    while (line := await self.reader.readline()) not in (b"\r\n", b""):
                        name, _, value = line.partition(b":")
                        name = name.strip().lower()
                        if name == b"content-length":
                            length = int(value)
                        elif name == b"connection" and b"close" in value.lower():
                            close = True
                    payload = await self.reader.readexactly(length) if length else b""
                    if close:
                        self.close()
                    self.last_ok = time.monotonic()
                    return status, msgpack.unpackb(payload) if payload else None
                except (OSError, IndexError, ValueError, asyncio.IncompleteReadError):
                    self.close()
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class LightNode:
    """A node of ``concurrency`` slots, each: lease -> a rollout of ``generation_seconds``
    on average (0.5-1.5x, uniform) -> submit the group (leasing the next in the same
    call)."""

    def __init__(self, url: str, token: str, node_id: str, concurrency: int,
                 generation_seconds: float, group_size: int, record: dict[str, list]) -> None:
        self.wire = Wire(url, token)
        self.node_id, self.concurrency = node_id, concurrency
        self.generation_seconds, self.group_size = generation_seconds, group_size
        self.record = record
        self.heartbeat_interval = 2.0
        self.done = 0
        self.rng = random.Random(node_id)

    async def register(self) -> None:
        body = {"kind": "raas", "node_id": self.node_id,
                "labels": {"pool": "sim", "region": "local", "policies": [], "capacity": 1}}
        while True:
            status, data = await self.wire.call("POST", "/v1/nodes", body)
            if status == 200:
                self.heartbeat_interval = float(data["heartbeat_interval"])
                return
            await asyncio.sleep(float((data or {}).get("retry_after", 1.0)))

    async def run(self, stop: asyncio.Event) -> None:
        await self.register()
        slots = [asyncio.create_task(self.slot(stop)) for _ in range(self.concurrency)]
        try:
            await self.beat(stop)
        finally:
            for s in slots:
                s.cancel()
            self.wire.close()

    async def beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            quiet = time.monotonic() - self.wire.last_ok
            if quiet < self.heartbeat_interval:  # a lease or submit was heard: enough
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.heartbeat_interval - quiet)
                continue
            status, data = await self.wire.call(
                "POST", f"/v1/nodes/{self.node_id}/heartbeat")
            if status == 404:
                await self.register()
            elif status == 200:
                self.heartbeat_interval = float(data.get("heartbeat_interval",
                                                         self.heartbeat_interval))

    async def slot(self, stop: asyncio.Event) -> None:
        lease: dict[str, Any] | None = None
        while not stop.is_set():
            if lease is None:
                t0 = time.perf_counter()
                status, data = await self.wire.call(
                    "POST", "/v1/leases", {"node_id": self.node_id, "max_tasks": 1,
                                           "wait": 0.0, "versions": {}})
                self.record["lease"].append((time.time(), time.perf_counter() - t0))
                if status == 404:
                    await self.register()
                    continue
                leases = (data or {}).get("leases", [])
                if not leases:
                    await asyncio.sleep(float((data or {}).get("retry_after", 1.0)))
                    continue
                lease = leases[0]
            # rollouts differ in length (identical ones would keep every node in step)
            await asyncio.sleep(self.generation_seconds * self.rng.uniform(0.5, 1.5))
            assert lease is not None
            body = {"lease_id": lease["lease_id"], "node_id": self.node_id,
                    "trajectories": light_group(lease["task"]["task_id"], self.group_size),
                    "lease": {"max_tasks": 1, "versions": {}}}
            t0 = time.perf_counter()
            status, data = await self.wire.call("POST", "/v1/trajectories", body)
            self.record["submit"].append((time.time(), time.perf_counter() - t0))
            if status == 200:
                self.done += 1
            lease = ((data or {}).get("leases") or [None])[0] if status == 200 else None


async def run_light_nodes(url: str, token: str, first: int, count: int, concurrency: int,
                          generation_seconds: float, group_size: int,
                          stop_file: Path) -> dict[str, Any]:
    """``count`` light nodes on this event loop until ``stop_file`` exists; every lease
    and submit timed."""
    record: dict[str, list] = {"lease": [], "submit": []}
    stop = asyncio.Event()
    nodes = [LightNode(url, token, f"sim-{i}", concurrency, generation_seconds,
                       group_size, record) for i in range(first, first + count)]
    runs = [asyncio.create_task(n.run(stop)) for n in nodes]
    while not stop_file.exists():
        await asyncio.sleep(0.2)
    stop.set()
    for r in runs:
        r.cancel()
    ended = await asyncio.gather(*runs, return_exceptions=True)
    errors = [repr(e) for e in ended
              if isinstance(e, BaseException) and not isinstance(e, asyncio.CancelledError)]
    return {"leases": record["lease"], "submits": record["submit"], "errors": errors,
            "rollouts": sum(n.done for n in nodes),
            "connects": sum(n.wire.connects for n in nodes)}
