"""Nodes: registration, heartbeats and leaving, of rollout nodes and trainers alike.

A node that leaves, or misses its heartbeats, is retired: its leases go back to the
task queue at once. A policy every trainer of which is gone is *orphaned*: admission
gives it no budget and its surplus is dropped instead of refusing whole submissions.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

from astraflow.dataflow.records import NodeRec, ServiceError
from astraflow.dataflow.signals import Signals
from astraflow.dataflow.store import Store
from astraflow.dataflow.tasks import TaskQueue
from astraflow.dataflow.wire import RegisterIn

#: heartbeats a second the data layer asks of its nodes at most: a pool so large that a
#: beat every third of the timeout would be more is told to beat less often (and its
#: timeout grows with it), as Nomad paces its clients' heartbeats by cluster size; a
#: lease or a submission counts as a beat, so a busy node need send none
HEARTBEATS_PER_SECOND = 100.0


class Nodes:
    def __init__(self, store: Store, tasks: TaskQueue,
                 signals: Signals) -> None:
        self._store, self._tasks, self._signals = store, tasks, signals
        self._nodes: dict[str, NodeRec] = {}
        #: what is derived from every node (counted again only after a node joins,
        #: leaves or is forgotten: leases ask for it, and there may be 10,000 nodes)
        self._changes, self._seen_at = 0, -1
        self._rollout: list[NodeRec] = []
        self._active = 0
        self._orphaned: dict[str, bool] = {}

    def _derived(self) -> None:
        if self._seen_at == self._changes:
            return
        self._seen_at = self._changes
        active = [n for n in self._nodes.values() if n.state == "active"]
        self._active = len(active)
        self._rollout = [n for n in active if n.kind == "raas"]
        self._orphaned = {}

    def load(self, conn: sqlite3.Connection) -> None:
        now = time.monotonic()
        for node_id, kind, labels, state, registered_at in conn.execute(
            "SELECT node_id, kind, labels, state, registered_at FROM nodes"
        ):
            # heartbeats are not persisted: a restart gives every live node a fresh grace period
            self._nodes[node_id] = NodeRec(
                node_id, kind, json.loads(labels), state, registered_at, now)
        self._changes += 1

    def __iter__(self) -> Iterator[NodeRec]:
        return iter(list(self._nodes.values()))

    def get(self, node_id: str | None) -> NodeRec | None:
        return self._nodes.get(node_id or "")

    def active(self, node_id: str) -> NodeRec:
        """The registered, active node ``node_id`` (404 if it is not)."""
        node = self._nodes.get(node_id)
        if node is None or node.state != "active":
            state = "unknown" if node is None else node.state
            raise ServiceError(404, f"node {node_id!r} is not registered ({state}): register again")
        return node

    def heartbeat_interval(self, timeout: float) -> float:
        """The interval nodes are asked to beat at: a third of ``timeout``, longer when
        the active nodes would beat more than HEARTBEATS_PER_SECOND. A node is retired
        after three intervals of silence."""
        self._derived()
        return max(timeout / 3, self._active / HEARTBEATS_PER_SECOND)

    def rollout_nodes(self) -> list[NodeRec]:
        """The active rollout nodes."""
        self._derived()
        return list(self._rollout)

    def rollout_count(self) -> int:
        """How many rollout nodes are active."""
        self._derived()
        return len(self._rollout)

    def pool_sizes(self) -> dict[str, int]:
        return dict(Counter(n.labels.get("pool", "default") for n in self.rollout_nodes()))

    def orphaned(self, policy: str) -> bool:
        """Every trainer that ever served ``policy`` is gone (it left or went silent);
        a policy whose trainer has not registered yet is not orphaned."""
        self._derived()
        if policy not in self._orphaned:
            trainers = [n for n in self._nodes.values()
                        if n.kind == "trainer" and policy in n.labels.get("policies", [])]
            self._orphaned[policy] = bool(trainers) and all(n.state != "active"
                                                            for n in trainers)
        return self._orphaned[policy]

    async def register(self, req: RegisterIn) -> NodeRec:
        node_id = req.node_id or f"{req.kind}-{uuid.uuid4().hex[:12]}"
        existing = self._nodes.get(node_id)
        if existing is not None and existing.kind != req.kind:
            raise ServiceError(409, f"node {node_id!r} is registered as a {existing.kind}")
        labels = req.labels.model_dump()
        rec = NodeRec(node_id, req.kind, labels, "active", time.time(), time.monotonic())
        await self._store.run(
            lambda c: c.execute(
                "INSERT INTO nodes(node_id, kind, labels, state, registered_at) "
                "VALUES (?, ?, ?, 'active', ?) ON CONFLICT(node_id) DO UPDATE SET "
                "labels = excluded.labels, state = 'active'",
                (node_id, req.kind, json.dumps(labels), rec.registered_at),
            )
        )
        self._nodes[node_id] = rec
        self._changes += 1
        return rec

    def heartbeat(self, node_id: str) -> None:
        self.active(node_id).last_seen = time.monotonic()

    async def retire(self, node: NodeRec, state: str) -> None:
        """Take a node out (``left`` or ``retired``); its leases are re-issuable at once."""
        node.state = state
        self._changes += 1
        self._tasks.release_node(node.node_id, time.time())
        deltas = Counter({"nodes_retired": int(state == "retired")})

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE nodes SET state = ? WHERE node_id = ?", (state, node.node_id))

        await self._store.run(job, deltas)
        self._signals.pulse_changed()

    def forget_departed(self, before: float) -> list[str]:
        """Forget the rollout nodes that left or were retired and were last heard of
        before ``before`` (monotonic seconds); their ids. Trainers are kept: that every
        trainer of a policy is gone is what marks it orphaned."""
        gone = [n.node_id for n in self._nodes.values()
                if n.kind == "raas" and n.state != "active" and n.last_seen < before]
        for node_id in gone:
            del self._nodes[node_id]
        self._changes += bool(gone)
        return gone

    def excuse(self, seconds: float) -> None:
        """Count ``seconds`` of the data layer's own absence as heard from every active
        node (none could reach it)."""
        now = time.monotonic()
        for n in self._nodes.values():
            if n.state == "active":
                n.last_seen = min(now, n.last_seen + seconds)

    def silent(self, horizon: float) -> list[NodeRec]:
        """Active nodes last heard of before ``horizon`` (monotonic seconds)."""
        return [n for n in self._nodes.values() if n.state == "active" and n.last_seen < horizon]

    def summary(self) -> list[dict[str, Any]]:
        """Every node as /v1/status shows it (without its leases and pace)."""
        now = time.monotonic()
        return [{"node_id": n.node_id, "kind": n.kind, "state": n.state, "labels": n.labels,
                 "seconds_since_heartbeat": round(now - n.last_seen, 3)}
                for n in self._nodes.values()]
