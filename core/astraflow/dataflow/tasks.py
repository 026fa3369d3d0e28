"""The task queue: every task not yet done, the order they are issued in, the leases'
deadlines, and the cursor into the run's task source.

Tasks come from the source (epoch after epoch) or from ``POST /v1/tasks``. A leased
task goes back to the front of the queue when its deadline passes or its node leaves;
a task is done once a submission for it is committed, and remembered as done (a late
duplicate is answered "duplicate") for ``retain_seconds``. The queue holds the state
only: what is written to the store, and when, is its callers' to decide.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import sqlite3
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

from astraflow.contracts import TaskSource
from astraflow.dataflow.records import Remembered, ServiceError, TaskRec
from astraflow.types import Task


class TaskQueue:
    def __init__(self, source: TaskSource | None) -> None:
        self.source = source
        self._tasks: dict[str, TaskRec] = {}  # not yet done
        #: done tasks, and when each was done: what retention forgets
        self._done = Remembered()
        self._ready: deque[str] = deque()  # pending task ids, re-issues first
        self._expiry: list[tuple[float, str, int]] = []  # (deadline, task id, attempt)
        self._next_seq = 1
        #: the source's cursor: the epoch, and the next task's index in it
        self.epoch = 0
        self.index = 0
        self._source_iter: Iterator[Task] | None = None
        #: tasks leased now (kept as they change: admission asks at every lease)
        self._leased = 0

    def load(self, conn: sqlite3.Connection) -> None:
        """Rebuild the queue from the store (after a restart, a crash too)."""
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key = 'cursor'"))
        cursor = json.loads(meta.get("cursor", '{"epoch": 0, "index": 0}'))
        self.epoch, self.index = cursor["epoch"], cursor["index"]
        for row in conn.execute(
            "SELECT task_id, task, state, attempt, node_id, deadline, seq FROM tasks "
            "WHERE state != 'done' ORDER BY seq"
        ):
            rec = TaskRec(row[0], json.loads(row[1]), *row[2:])
            self._tasks[rec.task_id] = rec
            self._leased += rec.state == "leased"
            if rec.state == "pending":
                self._ready.append(rec.task_id)
            elif rec.deadline is not None:
                heapq.heappush(self._expiry, (rec.deadline, rec.task_id, rec.attempt))
        now = time.time()
        for task_id, done_at in conn.execute(
                "SELECT task_id, done_at FROM tasks WHERE state = 'done' "
                "ORDER BY done_at IS NOT NULL, done_at"):
            self._done.add(task_id, now if done_at is None else done_at)
        self._next_seq = (conn.execute("SELECT max(seq) FROM tasks").fetchone()[0] or 0) + 1

    # ---- what is in it ---------------------------------------------------------------

    def in_flight(self) -> int:
        return self._leased

    def pending(self) -> int:
        return sum(1 for r in self._tasks.values() if r.state == "pending")

    def leased_per_node(self) -> Counter[str | None]:
        return Counter(r.node_id for r in self._tasks.values() if r.state == "leased")

    def cursor(self) -> tuple[int, int]:
        return self.epoch, self.index

    def cursor_json(self) -> str:
        return json.dumps({"epoch": self.epoch, "index": self.index})

    def leased_task(self, lease_id: str) -> TaskRec | None:
        """The task a lease id names; None if that task is already done (or a
        submission of it is committing: this one is a duplicate)."""
        task_id, sep, attempt = lease_id.rpartition("|")
        if not sep or not attempt.isdigit():
            raise ServiceError(422, f"lease_id {lease_id!r} is malformed: expected TASK|ATTEMPT")
        if task_id in self._done:
            return None
        rec = self._tasks.get(task_id)
        if rec is None:
            raise ServiceError(404, f"lease {lease_id!r} names a task unknown here (never "
                                    "issued, or done longer ago than retain_seconds)")
        if not 1 <= int(attempt) <= rec.attempt:
            raise ServiceError(409, f"lease {lease_id!r} was never issued")
        return None if rec.state == "done" else rec

    # ---- leases ----------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Move leases past their deadline back to the front of the queue."""
        expired = []
        while self._expiry and self._expiry[0][0] <= now:
            _deadline, task_id, attempt = heapq.heappop(self._expiry)
            rec = self._tasks.get(task_id)
            if (rec and rec.state == "leased" and rec.attempt == attempt
                    and rec.deadline is not None and rec.deadline <= now):
                rec.state = "pending"
                self._leased -= 1
                expired.append(task_id)
        self._ready.extendleft(reversed(expired))
        return len(expired)

    def postpone(self, seconds: float) -> int:
        """Every lease's deadline ``seconds`` later (the data layer itself was not
        running); how many leases."""
        leased = [rec for rec in self._tasks.values()
                  if rec.state == "leased" and rec.deadline is not None]
        for rec in leased:
            rec.deadline = (rec.deadline or 0.0) + seconds
        self._expiry = [(rec.deadline or 0.0, rec.task_id, rec.attempt) for rec in leased]
        heapq.heapify(self._expiry)
        return len(leased)

    def next_ready(self) -> TaskRec | None:
        """The next pending task of the queue (re-issues first), or None."""
        while self._ready:
            rec = self._tasks.get(self._ready.popleft())
            if rec is not None and rec.state == "pending":
                return rec
        return None

    def next_from_source(self) -> tuple[Task, int] | None:
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

    def add_from_source(self, task: Task, epoch: int) -> TaskRec:
        """A task of the source in the queue, under an id unique across epochs."""
        task_id = f"{task.task_id}#{epoch}"
        while task_id in self._tasks or task_id in self._done:
            task_id += "+"
        # shallow: asdict's deep copy was a visible share of every lease
        issued = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
        issued["task_id"] = task_id
        issued["metadata"] = {**task.metadata, "source_task_id": task.task_id, "epoch": epoch}
        rec = TaskRec(task_id, issued, "pending", 0, None, None, self._new_seq())
        self._tasks[task_id] = rec
        return rec

    def lease_out(self, recs: list[TaskRec], node_id: str, deadline: float) -> None:
        for rec in recs:
            self._leased += rec.state != "leased"
            rec.state, rec.node_id, rec.deadline = "leased", node_id, deadline
            rec.attempt += 1
            heapq.heappush(self._expiry, (deadline, rec.task_id, rec.attempt))
        if len(self._expiry) > 2 * len(self._tasks) + 1024:
            self._compact_expiry()

    def _compact_expiry(self) -> None:
        """Drop the deadlines of leases that ended (their task is done, or was leased
        again): a task done long before its deadline would otherwise keep its entry for
        ``lease_seconds`` -- at a high rate with long leases, most of the heap."""
        live = []
        for entry in self._expiry:
            rec = self._tasks.get(entry[1])
            if rec is not None and rec.state == "leased" and rec.attempt == entry[2]:
                live.append(entry)
        heapq.heapify(live)
        self._expiry = live

    def release_node(self, node_id: str, now: float) -> None:
        """A node is gone: its leases may be issued again at once."""
        for rec in self._tasks.values():
            if rec.state == "leased" and rec.node_id == node_id:
                rec.deadline = now
                heapq.heappush(self._expiry, (now, rec.task_id, rec.attempt))
        self.expire(now)

    # ---- done ------------------------------------------------------------------------

    def reserve(self, rec: TaskRec) -> str:
        """Mark ``rec`` done while its submission commits (a concurrent duplicate then
        sees it as done); the state it had, for :meth:`unreserve`."""
        previous, rec.state = rec.state, "done"
        self._leased -= previous == "leased"
        return previous

    def unreserve(self, rec: TaskRec, previous: str) -> None:
        rec.state = previous
        self._leased += previous == "leased"

    def complete(self, task_id: str, when: float) -> None:
        self._leased -= self._tasks.pop(task_id).state == "leased"
        self._done.add(task_id, when)

    def forget_done(self, before: float) -> int:
        """Forget the tasks done before ``before`` (their duplicates are refused as
        unknown from now on); how many. The store deletes its rows alike."""
        return self._done.forget(before)

    def done_count(self) -> int:
        return len(self._done)

    # ---- tasks posted over HTTP ------------------------------------------------------

    def new_posted(self, tasks: list[dict[str, Any]]) -> tuple[list[TaskRec], list[str]]:
        """Records for the posted tasks not seen before, and the ids of the others."""
        fresh, duplicates = [], []
        seen: set[str] = set()
        for task in tasks:
            task_id = task["task_id"]
            if task_id in self._tasks or task_id in self._done or task_id in seen:
                duplicates.append(task_id)
                continue
            seen.add(task_id)
            fresh.append(TaskRec(task_id, task, "pending", 0, None, None, self._new_seq()))
        return fresh, duplicates

    def hold(self, recs: list[TaskRec]) -> None:
        """Posted tasks being committed: known (a repeat is a duplicate), not issued."""
        self._tasks.update((rec.task_id, rec) for rec in recs)

    def drop(self, recs: list[TaskRec]) -> None:
        for rec in recs:
            self._leased -= rec.state == "leased"
            del self._tasks[rec.task_id]

    def enqueue(self, recs: list[TaskRec]) -> None:
        self._ready.extend(rec.task_id for rec in recs)

    def _new_seq(self) -> int:
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        return seq
