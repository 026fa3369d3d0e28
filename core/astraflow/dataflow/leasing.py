"""Leasing: issuing tasks to a node as admission control allows, the pace a node
should keep, and tasks posted over HTTP.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from typing import Any

from astraflow.dataflow.admission import Grant, PolicyView, Snapshot, admit
from astraflow.dataflow.algorithms import DataAlgorithms
from astraflow.dataflow.batches import BatchServer
from astraflow.dataflow.ledger import Ledger
from astraflow.dataflow.nodes import Nodes
from astraflow.dataflow.overload import Overload
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.records import NodeRec, TaskRec
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.signals import Signals
from astraflow.dataflow.store import Store
from astraflow.dataflow.tasks import TaskQueue
from astraflow.dataflow.timeline import Timeline
from astraflow.dataflow.versions import Versions
from astraflow.dataflow.wire import LeaseIn, TasksIn


class Leasing:
    def __init__(self, batches: BatchServer, *, settings: DataflowSettings, store: Store,
                 tasks: TaskQueue, ledger: Ledger, nodes: Nodes, versions: Versions,
                 algorithms: DataAlgorithms, signals: Signals, pacing: Pacing, timeline: Timeline,
                 overload: Overload) -> None:
        self._settings = settings
        self._store = store
        self._tasks = tasks
        self._ledger = ledger
        self._nodes = nodes
        self._versions = versions
        self._algorithms = algorithms
        self._signals = signals
        self._pacing = pacing
        self._timeline = timeline
        self._overload = overload
        self._batches = batches
        #: per policy, how often admission control issued nothing, by reason
        self.refusals: dict[str, Counter[str]] = {p: Counter() for p in versions.policies}

    def samples_per_task(self, policy: str) -> float:
        completed = self._store.counters["tasks_completed"]
        if completed == 0:
            return float(self._settings.group_size)
        return self._store.counters[f"produced:{policy}"] / completed

    def snapshot(self, held: dict[str, int], node_id: str | None) -> Snapshot:
        """What admission control decides on, for ``node_id`` holding the versions
        ``held`` (a policy it does not name: the latest)."""
        s = self._settings
        views = {}
        for policy in self._versions.policies:
            batches = self._ledger.held(policy)
            current = self._versions[policy]
            views[policy] = PolicyView(
                max_staleness=self._versions.max_staleness(policy),
                samples_per_task=self.samples_per_task(policy),
                buffered=self._ledger.buffered(policy), committing=self._ledger.committing(policy),
                lag=max(0, current - held.get(policy, current)),
                running=self._batches.unpublished(policy, batches), held_batches=len(batches),
                meanwhile=self._pacing.steps_meanwhile(policy, node_id) if node_id else 0.0,
                turnaround=self._pacing.turnaround(node_id or ""),
                cover=self._pacing.steps_to_cover(policy),
                steps_left=self._batches.steps_left(policy), orphaned=self._nodes.orphaned(policy))
        return Snapshot(s.batch_size, s.buffer_capacity, s.end_spare_batches,
                        self._tasks.in_flight(), views)

    def admission(self, held: dict[str, int], node_id: str | None = None) -> Grant:
        """How many more tasks ``node_id`` may be issued now, and why not more (the
        refusals counted per policy)."""
        grant = admit(self.snapshot(held, node_id))
        for policy, kind in grant.kinds.items():
            self.refusals[policy][kind] += 1
        return grant

    def _grant(self, node: NodeRec, req: LeaseIn
               ) -> tuple[list[TaskRec], dict[str, str], int]:
        """The tasks granted, why not more, and how many the task selectors skipped."""
        tasks, selectors = self._tasks, self._algorithms.selectors
        tasks.expire(time.time())
        grant = self.admission(req.versions, node.node_id)
        want = min(req.max_tasks, grant.tasks)
        granted: list[TaskRec] = []
        while len(granted) < want and (rec := tasks.next_ready()) is not None:
            granted.append(rec)
        examined = skipped = 0
        while len(granted) < want and examined < max(64, 8 * want):
            nxt = tasks.next_from_source()
            if nxt is None:
                break
            examined += 1
            if not all(sel.should_issue(nxt[0]) for sel in selectors):
                skipped += 1
                continue
            granted.append(tasks.add_from_source(*nxt))
        tasks.lease_out(granted, node.node_id, time.time() + self._settings.lease_seconds)
        for rec in granted:
            self._pacing.leased(rec.task_id)
        return granted, grant.reasons, skipped

    async def lease(self, req: LeaseIn) -> dict[str, Any]:
        node = self._nodes.active(req.node_id)
        node.last_seen = time.monotonic()
        if not self._overload.admit():  # at once: the nodes granted leases are served
            return {"leases": [], "pace": self.pace(node.node_id), "overloaded": True,
                    "backpressure": {"*": "the data layer is overloaded: come back later"},
                    "retry_after": self._overload.retry_after()}
        if req.versions:
            self._timeline.lease(node.node_id, req.versions)
        give_up = time.monotonic() + req.wait
        cursor_was, skipped = self._tasks.cursor(), 0
        while True:
            changed = self._signals.changed()
            granted, reasons, more = self._grant(node, req)
            skipped += more
            remaining = give_up - time.monotonic()
            if granted or remaining <= 0:
                break
            await self._signals.wait(changed, remaining)
        # task selectors may skip every task they see: their state, the skips and the
        # dataset cursor are written all the same
        if granted or self._tasks.cursor() != cursor_was:
            await self._record(granted, skipped)
        out: dict[str, Any] = {"leases": [self._lease_reply(r) for r in granted],
                               "pace": self.pace(node.node_id)}
        if not granted:
            out["backpressure"] = reasons or {"*": "no tasks available"}
            out["retry_after"] = min(1.0, self._settings.lease_seconds / 4)
        return out

    async def _record(self, granted: list[TaskRec], skipped: int) -> None:
        """Write the leases, the cursor and the selectors' states."""
        deltas = Counter(tasks_leased=len(granted),
                         tasks_issued=sum(r.attempt == 1 for r in granted),
                         tasks_reissued=sum(r.attempt > 1 for r in granted))
        rows = [(r.task_id, json.dumps(r.task), r.attempt, r.node_id, r.deadline, r.seq)
                for r in granted]
        cursor, plugins = self._tasks.cursor_json(), self._algorithms.updates()

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO tasks(task_id, task, state, attempt, node_id, deadline, seq) "
                "VALUES (?, ?, 'leased', ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
                "state = 'leased', attempt = excluded.attempt, node_id = excluded.node_id, "
                "deadline = excluded.deadline",
                rows,
            )
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('cursor', ?)",
                         (cursor,))
            self._algorithms.save(conn, plugins)

        try:
            await self._store.run(job, deltas + Counter(tasks_skipped=skipped))
        except Exception:
            # the leases stay in memory, unknown to the node: they expire and are issued
            # again; the cursor is written with the next lease
            self._algorithms.unsaved(plugins)
            raise

    def _lease_reply(self, rec: TaskRec) -> dict[str, Any]:
        return {"lease_id": f"{rec.task_id}|{rec.attempt}", "task": rec.task,
                "group_size": self._settings.group_size, "deadline": rec.deadline,
                "versions": self._versions.all()}

    def pace(self, node_id: str) -> dict[str, Any]:
        """What this node should sustain: its share of the tasks per second the trainers
        would consume if never kept waiting (None until a trainer has stepped), and its
        measured turnaround. In flight = rate x turnaround (Little's law) is then the
        concurrency that keeps the trainers fed without holding leases idle."""
        demand = None
        for policy in self._versions.policies:
            rate, per_task = self._pacing.fed_step_rate(policy), self.samples_per_task(policy)
            if rate is not None and per_task > 0 and not self._nodes.orphaned(policy):
                need = rate * self._settings.batch_size / per_task
                demand = need if demand is None else max(demand, need)
        nodes = self._nodes.rollout_count()
        return {"tasks_per_second": None if demand is None else demand / max(nodes, 1),
                "turnaround_seconds": self._pacing.turnaround(node_id)}

    async def post_tasks(self, req: TasksIn) -> dict[str, Any]:
        """Queue tasks sent over HTTP (idempotent by task id)."""
        fresh, duplicates = self._tasks.new_posted([t.model_dump() for t in req.tasks])
        rows = [(r.task_id, json.dumps(r.task), r.seq) for r in fresh]
        deltas = Counter(tasks_posted=len(fresh))

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO tasks(task_id, task, state, attempt, seq) "
                "VALUES (?, ?, 'pending', 0, ?)",
                rows,
            )

        self._tasks.hold(fresh)
        try:
            await self._store.run(job, deltas)
        except Exception:
            self._tasks.drop(fresh)
            raise
        self._tasks.enqueue(fresh)
        self._signals.pulse_changed()
        return {"accepted": len(fresh), "duplicates": duplicates}
