"""Nodes: registration, heartbeats, leaving, and the reaper that expires
leases and retires silent nodes.

A part of :class:`~astraflow.dataflow.service.DataflowService`: the state it reads and
writes is set up there.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import sqlite3
import time
import uuid
from collections import Counter
from typing import Any

from astraflow.dataflow.records import (
    STORE_ERRORS,
    NodeRec,
    ServiceError,
)
from astraflow.dataflow.state import ServiceState
from astraflow.dataflow.wire import RegisterIn

log = logging.getLogger("astraflow.dataflow")


class NodesMixin(ServiceState):
    """Mixed into DataflowService (see the module's docstring)."""

    async def register(self, req: RegisterIn) -> dict[str, Any]:
        node_id = req.node_id or f"{req.kind}-{uuid.uuid4().hex[:12]}"
        existing = self.nodes.get(node_id)
        if existing is not None and existing.kind != req.kind:
            raise ServiceError(409, f"node {node_id!r} is registered as a {existing.kind}")
        labels = req.labels.model_dump()
        rec = NodeRec(node_id, req.kind, labels, "active", time.time(), time.monotonic())
        await self.store.run(
            lambda c: c.execute(
                "INSERT INTO nodes(node_id, kind, labels, state, registered_at) "
                "VALUES (?, ?, ?, 'active', ?) ON CONFLICT(node_id) DO UPDATE SET "
                "labels = excluded.labels, state = 'active'",
                (node_id, req.kind, json.dumps(labels), rec.registered_at),
            )
        )
        self.nodes[node_id] = rec
        s = self.settings
        return {
            "node_id": node_id,
            "heartbeat_interval": s.heartbeat_timeout / 3,
            "heartbeat_timeout": s.heartbeat_timeout,
            "lease_seconds": s.lease_seconds,
            "group_size": s.group_size,
            "policies": {
                p: {"version": self.versions[p], "max_staleness": m}
                for p, m in self.policies.items()
            },
        }

    def _active(self, node_id: str) -> NodeRec:
        node = self.nodes.get(node_id)
        if node is None or node.state != "active":
            state = "unknown" if node is None else node.state
            raise ServiceError(404, f"node {node_id!r} is not registered ({state}): register again")
        return node

    def _orphaned(self, policy: str) -> bool:
        """Every trainer that ever served ``policy`` is gone (it left or went silent).

        Such a policy must not hold the other policies back: it gets no admission
        budget and its surplus is dropped (and counted) instead of refusing whole
        submissions. A policy whose trainer has not registered yet is not orphaned.
        """
        trainers = [n for n in self.nodes.values()
                    if n.kind == "trainer" and policy in n.labels.get("policies", [])]
        return bool(trainers) and all(n.state != "active" for n in trainers)

    def heartbeat(self, node_id: str) -> dict[str, Any]:
        self._active(node_id).last_seen = time.monotonic()
        return {"node_id": node_id, "versions": self.versions}

    async def leave(self, node_id: str) -> dict[str, Any]:
        node = self._active(node_id)
        await self._retire(node, "left")
        return {"node_id": node_id, "state": "left"}

    async def _retire(self, node: NodeRec, state: str) -> None:
        """Take a node out; its leases become re-issuable at once."""
        node.state = state
        now = time.time()
        for rec in self.tasks.values():
            if rec.state == "leased" and rec.node_id == node.node_id:
                rec.deadline = now
                heapq.heappush(self.expiry, (now, rec.task_id, rec.attempt))
        self._expire()
        deltas = Counter({"nodes_retired": int(state == "retired")})

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE nodes SET state = ? WHERE node_id = ?", (state, node.node_id))

        await self.store.run(job, deltas)
        self.counters.update(deltas)
        self._pulse_changed()

    async def _reap_forever(self) -> None:
        s = self.settings
        interval = max(0.05, min(0.5, s.lease_seconds / 4, s.heartbeat_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                if self._expire():
                    self._pulse_changed()
                horizon = time.monotonic() - s.heartbeat_timeout
                for node in list(self.nodes.values()):
                    if node.state == "active" and node.last_seen < horizon:
                        log.info("node %s missed its heartbeats: retired", node.node_id)
                        await self._retire(node, "retired")
            except STORE_ERRORS:
                log.exception("dataflow reaper failed; retrying")
