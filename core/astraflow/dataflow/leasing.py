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
from astraflow.dataflow.batches import BatchServer
from astraflow.dataflow.parts import Parts
from astraflow.dataflow.records import NodeRec, TaskRec
from astraflow.dataflow.wire import LeaseIn, TasksIn


class Leasing:
    def __init__(self, parts: Parts, batches: BatchServer) -> None:
        self._p, self._batches = parts, batches
        #: per policy, how often admission control issued nothing, by reason
        self.refusals: dict[str, Counter[str]] = {p: Counter() for p in parts.versions.policies}

    def samples_per_task(self, policy: str) -> float:
        completed = self._p.store.counters["tasks_completed"]
        if completed == 0:
            return float(self._p.settings.group_size)
        return self._p.store.counters[f"produced:{policy}"] / completed

    def snapshot(self, held: dict[str, int], node_id: str | None) -> Snapshot:
        """What admission control decides on, for ``node_id`` holding the versions
        ``held`` (a policy it does not name: the latest)."""
        p, s = self._p, self._p.settings
        views = {}
        for policy in p.versions.policies:
            batches = p.ledger.held(policy)
            current = p.versions[policy]
            views[policy] = PolicyView(
                max_staleness=p.versions.max_staleness(policy),
                samples_per_task=self.samples_per_task(policy),
                buffered=p.ledger.buffered(policy), committing=p.ledger.committing(policy),
                lag=max(0, current - held.get(policy, current)),
                running=self._batches.unpublished(policy, batches), held_batches=len(batches),
                meanwhile=p.pacing.steps_meanwhile(policy, node_id) if node_id else 0.0,
                turnaround=p.pacing.turnaround(node_id or ""),
                cover=p.pacing.steps_to_cover(policy),
                steps_left=self._batches.steps_left(policy), orphaned=p.nodes.orphaned(policy))
        return Snapshot(s.batch_size, s.buffer_capacity, s.end_spare_batches,
                        p.tasks.in_flight(), views)

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
        tasks, selectors = self._p.tasks, self._p.algorithms.selectors
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
        tasks.lease_out(granted, node.node_id, time.time() + self._p.settings.lease_seconds)
        for rec in granted:
            self._p.pacing.leased(rec.task_id)
        return granted, grant.reasons, skipped

    async def lease(self, req: LeaseIn) -> dict[str, Any]:
        p = self._p
        node = p.nodes.active(req.node_id)
        node.last_seen = time.monotonic()
        if not p.overload.admit():  # at once: the nodes granted leases are served
            return {"leases": [], "pace": self.pace(node.node_id), "overloaded": True,
                    "backpressure": {"*": "the data layer is overloaded: come back later"},
                    "retry_after": p.overload.retry_after()}
        if req.versions:
            p.timeline.lease(node.node_id, req.versions)
        give_up = time.monotonic() + req.wait
        cursor_was, skipped = p.tasks.cursor(), 0
        while True:
            changed = p.signals.changed()
            granted, reasons, more = self._grant(node, req)
            skipped += more
            remaining = give_up - time.monotonic()
            if granted or remaining <= 0:
                break
            await p.signals.wait(changed, remaining)
        # task selectors may skip every task they see: their state, the skips and the
        # dataset cursor are written all the same
        if granted or p.tasks.cursor() != cursor_was:
            await self._record(granted, skipped)
        out: dict[str, Any] = {"leases": [self._lease_reply(r) for r in granted],
                               "pace": self.pace(node.node_id)}
        if not granted:
            out["backpressure"] = reasons or {"*": "no tasks available"}
            out["retry_after"] = min(1.0, p.settings.lease_seconds / 4)
        return out

    async def _record(self, granted: list[TaskRec], skipped: int) -> None:
        """Write the leases, the cursor and the selectors' states."""
        p = self._p
        deltas = Counter(tasks_leased=len(granted),
                         tasks_issued=sum(r.attempt == 1 for r in granted),
                         tasks_reissued=sum(r.attempt > 1 for r in granted))
        rows = [(r.task_id, json.dumps(r.task), r.attempt, r.node_id, r.deadline, r.seq)
                for r in granted]
        cursor, plugins = p.tasks.cursor_json(), p.algorithms.updates()

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
            p.algorithms.save(conn, plugins)

        try:
            await p.store.run(job, deltas + Counter(tasks_skipped=skipped))
        except Exception:
            # the leases stay in memory, unknown to the node: they expire and are issued
            # again; the cursor is written with the next lease
            p.algorithms.unsaved(plugins)
            raise

    def _lease_reply(self, rec: TaskRec) -> dict[str, Any]:
        return {"lease_id": f"{rec.task_id}|{rec.attempt}", "task": rec.task,
                "group_size": self._p.settings.group_size, "deadline": rec.deadline,
                "versions": self._p.versions.all()}

    def pace(self, node_id: str) -> dict[str, Any]:
        """What this node should sustain: its share of the tasks per second the trainers
        would consume if never kept waiting (None until a trainer has stepped), and its
        measured turnaround. In flight = rate x turnaround (Little's law) is then the
        concurrency that keeps the trainers fed without holding leases idle."""
        p = self._p
        demand = None
        for policy in p.versions.policies:
            rate, per_task = p.pacing.fed_step_rate(policy), self.samples_per_task(policy)
            if rate is not None and per_task > 0 and not p.nodes.orphaned(policy):
                need = rate * p.settings.batch_size / per_task
                demand = need if demand is None else max(demand, need)
        nodes = p.nodes.rollout_count()
        return {"tasks_per_second": None if demand is None else demand / max(nodes, 1),
                "turnaround_seconds": p.pacing.turnaround(node_id)}

    async def post_tasks(self, req: TasksIn) -> dict[str, Any]:
        """Queue tasks sent over HTTP (idempotent by task id)."""
        p = self._p
        fresh, duplicates = p.tasks.new_posted([t.model_dump() for t in req.tasks])
        rows = [(r.task_id, json.dumps(r.task), r.seq) for r in fresh]
        deltas = Counter(tasks_posted=len(fresh))

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO tasks(task_id, task, state, attempt, seq) "
                "VALUES (?, ?, 'pending', 0, ?)",
                rows,
            )

        p.tasks.hold(fresh)
        try:
            await p.store.run(job, deltas)
        except Exception:
            p.tasks.drop(fresh)
            raise
        p.tasks.enqueue(fresh)
        p.signals.pulse_changed()
        return {"accepted": len(fresh), "duplicates": duplicates}
