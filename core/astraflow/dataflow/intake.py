"""Intake: a leased task's trajectories, accepted exactly once, as a pipeline of steps.

check (the lease, the task, the policies, buffer room) -> group (by group and policy)
-> algorithms (task selectors observe, trajectory filters keep or drop) -> advantages
(the policy's estimator's group stage) -> rows (stale samples dropped, the rest
written) -> commit (payloads to the log, rows to the store, then the reply).
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from astraflow.dataflow.algorithms import Advantages, DataAlgorithms
from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.checks import CheckedTrajectory, check_trajectories
from astraflow.dataflow.ledger import Ledger
from astraflow.dataflow.nodes import Nodes
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.records import (
    UNKNOWN_POOL,
    ItemRec,
    ServiceError,
    TaskRec,
    pool_key,
    stale_key,
)
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.signals import Signals
from astraflow.dataflow.store import FRESH, Store
from astraflow.dataflow.tasks import TaskQueue
from astraflow.dataflow.timeline import Timeline
from astraflow.dataflow.versions import Versions
from astraflow.dataflow.wire import SubmitIn
from astraflow.types import Task, Trajectory

Group = list[CheckedTrajectory]


@dataclass
class Submission:
    """One submission on its way through the pipeline."""

    req: SubmitIn
    task: TaskRec
    checked: list[CheckedTrajectory]
    #: policies whose trainers are gone and whose buffer is full: their samples go
    overflow: set[str]
    node_id: str | None = None
    pool: str = UNKNOWN_POOL
    #: what every accepted sample's metadata is stamped with
    stamp: dict[str, Any] = field(default_factory=dict)
    deltas: Counter[str] = field(default_factory=lambda: Counter(tasks_completed=1))
    accepted: int = 0
    filtered: int = 0
    dropped: int = 0
    #: the accepted items' (id, policy, task id, group id, min version, pool)
    rows: list[tuple[int, str, str, str, int, str]] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)


class Intake:
    def __init__(self, *, settings: DataflowSettings, store: Store, tasks: TaskQueue,
                 ledger: Ledger, nodes: Nodes, versions: Versions, algorithms: DataAlgorithms,
                 advantages: Advantages, signals: Signals, pacing: Pacing, timeline: Timeline,
                 autoscale: AutoscaleWindow) -> None:
        self._settings = settings
        self._store = store
        self._tasks = tasks
        self._ledger = ledger
        self._nodes = nodes
        self._versions = versions
        self._algorithms = algorithms
        self._advantages = advantages
        self._signals = signals
        self._pacing = pacing
        self._timeline = timeline
        self._autoscale = autoscale
        #: the first traceback of a failed reward per policy (for the console and metrics)
        self.reward_errors: dict[str, str] = {}
        #: when (epoch seconds) this process accepted its first trajectory per policy:
        #: what start-up cost a run, until rollouts flowed
        self.first_accepted: dict[str, float] = {}

    async def accept(self, req: SubmitIn) -> dict[str, Any]:
        sub = self._check(req)
        if sub is None:
            self._store.counters["submissions_duplicate"] += 1
            return {"status": "duplicate", "task_id": req.lease_id.rpartition("|")[0]}
        previous = self._tasks.reserve(sub.task)
        try:
            self._stamp(sub)
            for (group_id, policy), members in self._group(sub).items():
                if self._keep_group(sub, policy, members):
                    advantages = self._group_advantages(policy, members)
                    self._rows(sub, group_id, policy, members, advantages)
            items = await self._commit(sub)
        except Exception:
            # refused (an estimator's bad answer, a failed commit): the task may be
            # submitted again
            self._tasks.unreserve(sub.task, previous)
            raise
        self._accepted(sub, items)
        return {"status": "accepted", "task_id": sub.task.task_id, "accepted": sub.accepted,
                "filtered": sub.filtered, "dropped_stale": sub.dropped}

    # ---- the steps -------------------------------------------------------------------

    def _check(self, req: SubmitIn) -> Submission | None:
        """The submission checked against its lease and the buffers (None: a duplicate)."""
        checked = check_trajectories(req.trajectories)
        rec = self._tasks.leased_task(req.lease_id)
        if rec is None:
            return None
        for i, ct in enumerate(checked):
            if ct.task_id != rec.task_id:
                raise ServiceError(
                    422, f"trajectories.{i}.task_id is {ct.task_id!r}, the lease is for "
                    f"{rec.task_id!r}"
                )
            self._versions.check(ct.policy)
        overflow = set()
        capacity = self._settings.buffer_capacity
        for policy, n in Counter(ct.policy for ct in checked).items():
            buffered = self._ledger.buffered(policy)
            if buffered + n > capacity:
                if self._nodes.orphaned(policy):
                    overflow.add(policy)
                    continue
                raise ServiceError(
                    429, f"buffer of policy {policy!r} is full ({buffered} of {capacity}); "
                    "retry after the trainer consumes"
                )
        return Submission(req, rec, checked, overflow)

    def _stamp(self, sub: Submission) -> None:
        rec, now = sub.task, time.time()
        sub.node_id = sub.req.node_id or rec.node_id
        node = self._nodes.get(sub.node_id)
        if node is not None and node.state == "active":
            node.last_seen = time.monotonic()  # heard from: as good as a heartbeat
        labels = node.labels if node else {}
        sub.pool = labels.get("pool", UNKNOWN_POOL)
        sub.stamp = {
            "task_type": rec.task.get("task_type", "default"),
            "source_task_id": rec.task.get("metadata", {}).get("source_task_id", rec.task_id),
            "lease_id": sub.req.lease_id,
            "node_id": sub.node_id,
            "pool": sub.pool,
            "region": labels.get("region", "unknown"),
            "leased_at": (rec.deadline or now) - self._settings.lease_seconds,
            "accepted_at": now,
        }

    @staticmethod
    def _group(sub: Submission) -> dict[tuple[str, str], Group]:
        groups: dict[tuple[str, str], Group] = {}
        for ct in sub.checked:
            groups.setdefault((ct.group_id, ct.policy), []).append(ct)
        return groups

    def _keep_group(self, sub: Submission, policy: str, members: Group) -> bool:
        """Count the group, show it to the task selectors and the filters: whether its
        samples go on (not filtered out, and their policy still trains)."""
        n, d = len(members), sub.deltas
        failed = sum(ct.outcome.failed for ct in members)
        d[f"produced:{policy}"] += n
        d[pool_key("produced", policy, sub.pool)] += n
        d[f"reward_failed:{policy}"] += failed
        # an over-provisioned group's samples cancelled on the node: never generated
        # trajectories, counted apart (each cost an engine request and an environment call)
        d[f"cancelled:{policy}"] += int(members[0].metadata.get("cancelled", 0) or 0)
        if failed and policy not in self.reward_errors:
            first = next(ct for ct in members if ct.outcome.failed)
            self.reward_errors[policy] = first.outcome.reason or ""
        algorithms = self._algorithms
        if algorithms.selectors:
            source_task = Task(**{**sub.task.task, "task_id": sub.stamp["source_task_id"]})
            for sel in algorithms.selectors:
                sel.observe_group(source_task, policy, [ct.reward for ct in members])
        if algorithms.filters:
            group: list[Trajectory] = [ct.to_trajectory() for ct in members]
            if not all(f.keep(group) for f in algorithms.filters):
                d[f"filtered:{policy}"] += n
                sub.filtered += n
                return False
        if policy in sub.overflow:
            d[f"dropped_no_trainer:{policy}"] += n
            sub.dropped += n
            return False
        return True

    def _group_advantages(self, policy: str, members: Group) -> list[float]:
        rollouts = [ct.metadata.get("rollout") for ct in members]
        return self._advantages.group(
            policy, [ct.reward for ct in members], [ct.outcome.failed for ct in members],
            rollouts if any(r is not None for r in rollouts) else None,
            [float(ct.metadata.get("rollout_reward", ct.reward)) for ct in members])

    def _rows(self, sub: Submission, group_id: str, policy: str, members: Group,
              advantages: list[float]) -> None:
        d, meta = sub.deltas, {**sub.stamp, "group_size": len(members)}
        for ct, advantage in zip(members, advantages, strict=True):
            if ct.min_version < 0:  # no trained token
                # a rollout that sampled nothing (an agent that failed before its first
                # call): counted above, in its group's baseline, never served
                d[f"filtered:{policy}"] += 1
                sub.filtered += 1
            elif self._versions.stale(policy, ct.min_version):
                d[f"dropped_stale:{policy}"] += 1
                d[stale_key(policy, sub.pool)] += 1
                sub.dropped += 1
            else:
                sub.rows.append((self._ledger.new_item_id(), policy, sub.task.task_id,
                                 group_id, ct.min_version, sub.pool))
                sub.payloads.append(ct.payload(advantage, {**ct.metadata, **meta}))
                d[f"accepted:{policy}"] += 1
                sub.accepted += 1

    async def _commit(self, sub: Submission) -> list[ItemRec]:
        """Payloads to the log, then the rows that point at them to the store."""
        rows, task_id = sub.rows, sub.task.task_id
        plugins = self._algorithms.updates()
        locs = self._store.payloads.append(sub.payloads) if sub.payloads else []
        items = [ItemRec(item_id, policy, task, group, min_version, loc, pool)
                 for (item_id, policy, task, group, min_version, pool), loc
                 in zip(rows, locs, strict=True)]

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO items(id, policy, task_id, group_id, state, min_version, pool, "
                "seg, off, len, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(i.id, i.policy, i.task_id, i.group_id, FRESH, i.min_version, i.pool, *i.loc)
                 for i in items],
            )
            conn.execute("UPDATE tasks SET state = 'done', done_at = ? WHERE task_id = ?",
                         (sub.stamp["accepted_at"], task_id))
            self._algorithms.save(conn, plugins)

        committing = Counter(item.policy for item in items)
        self._ledger.begin_commit(committing)  # admission control counts them meanwhile
        try:
            await self._store.run(job, sub.deltas)
        except Exception:
            self._store.payloads.release(locs)
            self._algorithms.unsaved(plugins)
            raise
        finally:
            self._ledger.end_commit(committing)
        return items

    def _accepted(self, sub: Submission, items: list[ItemRec]) -> None:
        """The submission is durable (its counters are in): the ledger and the series learn
        of it."""
        self._tasks.complete(sub.task.task_id, sub.stamp["accepted_at"])
        self._ledger.add_fresh(items)
        now = time.time()
        for policy in {i.policy for i in items}:
            self.first_accepted.setdefault(policy, now)
        if sub.accepted:
            self._autoscale.produce(sub.pool, sub.accepted)
        if self._nodes.get(sub.node_id) is not None:
            self._pacing.accepted(sub.task.task_id, sub.node_id or "")
            self._timeline.accept(sub.node_id, sub.accepted)
        for policy in {i.policy for i in items}:
            self._signals.pulse_arrival(policy)
