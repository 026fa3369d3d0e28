"""Tasks: the ledger of the task source, admission control (how many tasks a
node may hold without its samples going stale) and leases.

A part of :class:`~astraflow.dataflow.service.DataflowService`: the state it reads and
writes is set up there.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import math
import sqlite3
import time
from collections import Counter
from typing import Any

from astraflow.dataflow.records import (
    NodeRec,
    TaskRec,
)
from astraflow.dataflow.state import ServiceState
from astraflow.dataflow.wire import (
    LeaseIn,
    TasksIn,
)
from astraflow.types import Task


class LeasingMixin(ServiceState):
    """Mixed into DataflowService (see the module's docstring)."""

    def _expire(self) -> int:
        """Move leases past their deadline back to the front of the queue."""
        now = time.time()
        expired = []
        while self.expiry and self.expiry[0][0] <= now:
            _deadline, task_id, attempt = heapq.heappop(self.expiry)
            rec = self.tasks.get(task_id)
            if (rec and rec.state == "leased" and rec.attempt == attempt
                    and rec.deadline is not None and rec.deadline <= now):
                rec.state = "pending"
                expired.append(task_id)
        self.ready.extendleft(reversed(expired))
        return len(expired)

    def _source_next(self) -> tuple[Task, int] | None:
        """The next dataset task and its epoch, cycling epoch after epoch."""
        if self.source is None:
            return None
        for _ in range(2):
            if self._source_iter is None:
                self._source_iter = itertools.islice(self.source.train_tasks(), self.index, None)
            task = next(self._source_iter, None)
            if task is not None:
                self.index += 1
                return task, self.epoch
            if self.index == 0:
                return None  # an empty dataset
            self.epoch, self.index, self._source_iter = self.epoch + 1, 0, None
        return None

    def _samples_per_task(self, policy: str) -> float:
        completed = self.counters["tasks_completed"]
        if completed == 0:
            return float(self.settings.group_size)
        return self.counters[f"produced:{policy}"] / completed

    def _samples_still_needed(self, policy: str, held: int) -> int | None:
        """Samples the policy's trainer, holding ``held`` batches, has yet to be served
        for the steps it said it has left (None until it says), with
        ``end_spare_batches`` more while it needs any: a run's end generates nothing
        past its last batches, which take the first groups back, not the slowest."""
        left = self.steps_left.get(policy)
        if left is None:
            return None
        steps = max(0, left - held)
        spare = self.settings.end_spare_batches if steps else 0
        return (steps + spare) * self.settings.batch_size

    def admission(self, held: dict[str, int], node_id: str | None = None
                  ) -> tuple[int, dict[str, str]]:
        """How many more tasks ``node_id`` may be issued now, and why not more.

        A new task's samples are trained on at a version ``lag + running + k`` past the
        weights the node generates them with: ``lag`` versions the node is behind,
        ``running`` for a step in progress, and ``k`` batches before them -- those
        already queued (buffered, committing, in flight on every node) and at least
        as many as the trainer takes while this node rolls the task out (its measured
        turnaround over the trainer's measured step interval). Only tasks whose every
        sample keeps that within ``max_staleness`` and fits the buffer are issued, so
        nothing is generated to be dropped as stale: a node too far behind is told to
        refresh, one too slow for the bound is told why. Once what is queued covers
        the steps a trainer said it has left, nothing more is issued (a run's end
        leaves nothing generated for nobody); once every trainer is gone (the run is
        over), nothing is issued at all.
        """
        s = self.settings
        reasons: dict[str, str] = {}
        live = [p for p in self.policies if not self._orphaned(p)]
        if self.policies and not live:
            # the run is over (or every trainer died): whatever is generated now could
            # only be dropped; a returning trainer reopens admission
            for policy in self.policies:
                reasons[policy] = "every trainer is gone: nothing would train on new samples"
                self.refusals[policy]["trainer_gone"] += 1
            return 0, reasons
        in_flight = sum(1 for r in self.tasks.values() if r.state == "leased")
        allowed = 1 << 30
        for policy, max_staleness in self.policies.items():
            if policy not in live:  # it must not hold the live policies back
                continue
            per_task = self._samples_per_task(policy)
            if per_task <= 0:
                continue
            queued = len(self.fresh[policy]) + self._committing[policy] + in_flight * per_task
            lag = max(0, self.versions[policy] - held.get(policy, self.versions[policy]))
            held_batches = self._held(policy)
            running = self._unpublished(policy, held_batches)
            meanwhile = self.pacing.steps_meanwhile(policy, node_id) if node_id else 0.0
            budget = max_staleness - lag - running  # batches a new sample may wait
            room_stale = (budget + 1) * s.batch_size - queued
            room_cap = s.buffer_capacity - queued
            n = min(int(max(0.0, room_stale) // per_task), int(max(0.0, room_cap) // per_task))
            if (n == 0 and running == 0 and lag <= max_staleness
                    and 0 < s.batch_size - queued <= room_cap):
                # the trainer's next batch cannot fill from what is queued: it gets the
                # tasks that fill it even if the last one overshoots by part of a task
                # (with max_staleness=0 or a node behind, the batch would wait forever)
                n = math.ceil((s.batch_size - queued) / per_task)
            elif budget < 0 or int(meanwhile) > budget:
                n = 0
            needed = self._samples_still_needed(policy, len(held_batches))
            if needed is not None:  # the run's end: nothing beyond its last batch
                n = min(n, max(0, math.ceil((needed - queued) / per_task)))
            if n == 0 and needed is not None and needed <= queued:
                reasons[policy] = (f"enough for the run: the trainer's last "
                                   f"{self.steps_left[policy]} steps are covered by the "
                                   f"{queued:.0f} samples queued and the batches it holds")
                self.refusals[policy]["run_covered"] += 1
            elif n == 0:
                kind, reasons[policy] = self._refusal(policy, queued, in_flight, lag, running,
                                                      meanwhile, node_id, room_cap < room_stale)
                self.refusals[policy][kind] += 1
            allowed = min(allowed, n)
        return allowed, reasons

    def _refusal(self, policy: str, queued: float, in_flight: int, lag: int, running: int,
                 meanwhile: float, node_id: str | None, full: bool) -> tuple[str, str]:
        """Why admission control issues no task for ``policy``: a kind, and one line."""
        m = self.policies[policy]
        if full:
            return "buffer_full", (
                f"buffer full ({len(self.fresh[policy])} buffered + {in_flight} tasks in "
                f"flight, capacity {self.settings.buffer_capacity})")
        if lag + running > m:
            return "refresh_first", (
                f"refresh first: the node's weights are {lag} versions behind; its samples "
                f"would be trained on more than max_staleness={m} versions later")
        if int(meanwhile) > m - lag - running:
            turnaround = self.pacing.turnaround(node_id or "") or 0.0
            return "turnaround", (
                f"turnaround {turnaround:.2f}s: the trainer takes {meanwhile:.1f} steps while "
                f"this node rolls a task out, more than max_staleness={m} allows ({lag} "
                f"behind, {running} step running)")
        return "staleness", (
            f"staleness: {queued:.0f} samples queued would be consumed more than "
            f"max_staleness={m} versions after the node's weights ({lag} behind, {running} "
            "step running)")

    def _grant(self, node: NodeRec, req: LeaseIn) -> tuple[list[TaskRec], dict[str, str]]:
        self._expire()
        allowed, reasons = self.admission(req.versions, node.node_id)
        want = min(req.max_tasks, allowed)
        granted: list[TaskRec] = []
        while len(granted) < want and self.ready:
            rec = self.tasks.get(self.ready.popleft())
            if rec is not None and rec.state == "pending":
                granted.append(rec)
        examined = 0
        while len(granted) < want and examined < max(64, 8 * want):
            nxt = self._source_next()
            if nxt is None:
                break
            task, epoch = nxt
            examined += 1
            if not all(sel.should_issue(task) for sel in self.selectors):
                self.counters["tasks_skipped"] += 1
                continue
            task_id = f"{task.task_id}#{epoch}"
            while task_id in self.tasks or task_id in self.done:
                task_id += "+"
            # shallow: asdict's deep copy was a visible share of every lease
            issued = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
            issued["task_id"] = task_id
            issued["metadata"] = {**task.metadata, "source_task_id": task.task_id, "epoch": epoch}
            rec = TaskRec(task_id, issued, "pending", 0, None, None, self.next_seq)
            self.next_seq += 1
            self.tasks[task_id] = rec
            granted.append(rec)
        deadline = time.time() + self.settings.lease_seconds
        for rec in granted:
            rec.state, rec.node_id, rec.deadline = "leased", node.node_id, deadline
            self.pacing.leased(rec.task_id)
            rec.attempt += 1
            heapq.heappush(self.expiry, (deadline, rec.task_id, rec.attempt))
        return granted, reasons

    async def lease(self, req: LeaseIn) -> dict[str, Any]:
        node = self._active(req.node_id)
        node.last_seen = time.monotonic()
        if req.versions:
            self.timeline.lease(node.node_id, req.versions)
        give_up = time.monotonic() + req.wait
        cursor_was, skipped_was = (self.epoch, self.index), self.counters["tasks_skipped"]
        while True:
            changed = self._changed
            assert changed is not None  # made as the server starts, before any request
            granted, reasons = self._grant(node, req)
            remaining = give_up - time.monotonic()
            if granted or remaining <= 0:
                break
            await self._wait(changed, remaining)
        # task selectors may skip every task they see: their state, the skips and the
        # dataset cursor are written all the same
        if granted or (self.epoch, self.index) != cursor_was:
            skipped = Counter(tasks_skipped=self.counters["tasks_skipped"] - skipped_was)
            deltas = Counter(
                tasks_leased=len(granted),
                tasks_issued=sum(r.attempt == 1 for r in granted),
                tasks_reissued=sum(r.attempt > 1 for r in granted),
            )
            rows = [
                (r.task_id, json.dumps(r.task), r.attempt, r.node_id, r.deadline, r.seq)
                for r in granted
            ]
            cursor = json.dumps({"epoch": self.epoch, "index": self.index})
            plugins = self._plugin_updates()

            def job(conn: sqlite3.Connection) -> None:
                conn.executemany(
                    "INSERT INTO tasks(task_id, task, state, attempt, node_id, deadline, seq) "
                    "VALUES (?, ?, 'leased', ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
                    "state = 'leased', attempt = excluded.attempt, node_id = excluded.node_id, "
                    "deadline = excluded.deadline",
                    rows,
                )
                conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('cursor', ?)", (cursor,)
                )
                self._save_plugins(conn, plugins)

            await self.store.run(job, deltas + skipped)
            self.counters.update(deltas)
        leases = [
            {
                "lease_id": f"{r.task_id}|{r.attempt}",
                "task": r.task,
                "group_size": self.settings.group_size,
                "deadline": r.deadline,
                "versions": dict(self.versions),
            }
            for r in granted
        ]
        out: dict[str, Any] = {"leases": leases, "pace": self.pace(node.node_id)}
        if not granted:
            out["backpressure"] = reasons or {"*": "no tasks available"}
            out["retry_after"] = min(1.0, self.settings.lease_seconds / 4)
        return out

    def pace(self, node_id: str) -> dict[str, Any]:
        """What this node should sustain: its share of the tasks per second the trainers
        would consume if never kept waiting (None until a trainer has stepped), and its
        measured turnaround. In flight = rate x turnaround (Little's law) is then the
        concurrency that keeps the trainers fed without holding leases idle."""
        nodes = sum(1 for n in self.nodes.values() if n.kind == "raas" and n.state == "active")
        demand = None
        for policy in self.policies:
            rate, per_task = self.pacing.fed_step_rate(policy), self._samples_per_task(policy)
            if rate is not None and per_task > 0 and not self._orphaned(policy):
                need = rate * self.settings.batch_size / per_task
                demand = need if demand is None else max(demand, need)
        return {"tasks_per_second": None if demand is None else demand / max(nodes, 1),
                "turnaround_seconds": self.pacing.turnaround(node_id)}

    async def post_tasks(self, req: TasksIn) -> dict[str, Any]:
        """Queue tasks sent over HTTP (idempotent by task id)."""
        fresh, duplicates = [], []
        seen: set[str] = set()
        for t in req.tasks:
            if t.task_id in self.tasks or t.task_id in self.done or t.task_id in seen:
                duplicates.append(t.task_id)
                continue
            seen.add(t.task_id)
            rec = TaskRec(t.task_id, t.model_dump(), "pending", 0, None, None, self.next_seq)
            self.next_seq += 1
            fresh.append(rec)
        rows = [(r.task_id, json.dumps(r.task), r.seq) for r in fresh]
        deltas = Counter(tasks_posted=len(fresh))

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO tasks(task_id, task, state, attempt, seq) "
                "VALUES (?, ?, 'pending', 0, ?)",
                rows,
            )

        for rec in fresh:
            self.tasks[rec.task_id] = rec
        try:
            await self.store.run(job, deltas)
        except Exception:
            for rec in fresh:
                del self.tasks[rec.task_id]
            raise
        self.ready.extend(r.task_id for r in fresh)
        self.counters.update(deltas)
        self._pulse_changed()
        return {"accepted": len(fresh), "duplicates": duplicates}
