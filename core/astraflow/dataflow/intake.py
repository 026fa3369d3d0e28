"""Trajectories: submissions checked, filtered by the data algorithms,
grouped, and committed to the buffers before they are acknowledged.

A part of :class:`~astraflow.dataflow.service.DataflowService`: the state it reads and
writes is set up there.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections import Counter
from typing import Any

from astraflow.dataflow.records import (
    UNKNOWN_POOL,
    ItemRec,
    ServiceError,
    TaskRec,
    pool_key,
    stale_key,
)
from astraflow.dataflow.store import FRESH
from astraflow.dataflow.wire import (
    CheckedTrajectory,
    LeaseIn,
    SubmitIn,
    check_trajectories,
)
from astraflow.rewards.base import ERROR as REWARD_ERROR
from astraflow.rewards.base import FAILED as REWARD_FAILED
from astraflow.types import Task, Trajectory


class IntakeMixin:
    """Mixed into DataflowService (see the module's docstring)."""

    def _lease_task(self, lease_id: str) -> TaskRec | None:
        """The task a lease id names; None if that task is already done."""
        task_id, sep, attempt = lease_id.rpartition("|")
        if not sep or not attempt.isdigit():
            raise ServiceError(422, f"lease_id {lease_id!r} is malformed: expected TASK|ATTEMPT")
        if task_id in self.done:
            return None
        rec = self.tasks.get(task_id)
        if rec is None:
            raise ServiceError(404, f"lease {lease_id!r} names an unknown task")
        if not 1 <= int(attempt) <= rec.attempt:
            raise ServiceError(409, f"lease {lease_id!r} was never issued")
        if rec.state == "done":  # a submission of it is committing: this one is a duplicate
            return None
        return rec

    async def submit(self, req: SubmitIn) -> dict[str, Any]:
        """Accept every policy's trajectories of one leased task, exactly once; then,
        if asked, lease the node more tasks (one round trip per task for a busy node).

        The leases never fail an accepted submission: a node the service no longer
        knows gets none, and a reason, and registers again on its next lease call.
        """
        if req.lease is None:
            return await self._accept(req)
        if req.node_id is None:
            raise ServiceError(422, "lease: leasing more tasks needs the node_id")
        # both run up to their commit in this pass of the loop, so they share one
        # transaction; the lease looks first whether the submission was refused
        accept = asyncio.ensure_future(self._accept(req))
        more = asyncio.ensure_future(self._lease_after(accept, LeaseIn(
            node_id=req.node_id, max_tasks=req.lease.max_tasks, versions=req.lease.versions)))
        try:
            out = await accept
        finally:
            leases = await more
        return {**out, **leases}

    async def submit_many(self, reqs: list[SubmitIn]) -> list[dict[str, Any]]:
        """Each submission as :meth:`submit` handles it alone, together so that they
        share one store transaction; a refused one is answered with its error and
        does not refuse the others."""
        async def one(req: SubmitIn) -> dict[str, Any]:
            try:
                return await self.submit(req)
            except ServiceError as exc:
                return {"error": str(exc), "status_code": exc.status}

        return list(await asyncio.gather(*(one(req) for req in reqs)))

    async def _lease_after(self, accept: asyncio.Future, req: LeaseIn) -> dict[str, Any]:
        if accept.done() and (accept.cancelled() or accept.exception() is not None):
            return {}
        try:
            return await self.lease(req)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            return {"leases": [], "backpressure": {"*": str(exc)}}

    def _group_stage(self, policy: str, members: list[CheckedTrajectory], rewards: list[float],
                     failed: list[bool]) -> list[float]:
        """One advantage per member of a group, from the policy's estimator's group
        stage (``policies.<name>.advantage``); an agent's segments name their rollout."""
        rollouts = [ct.metadata.get("rollout") for ct in members]
        advantages = self.estimators[policy].group_advantages(
            rewards, failed=failed,
            rollouts=rollouts if any(r is not None for r in rollouts) else None,
            rollout_rewards=[float(ct.metadata.get("rollout_reward", ct.reward))
                             for ct in members])
        if len(advantages) != len(members) or not all(map(math.isfinite, advantages)):
            raise ServiceError(500, (
                f"the advantage estimator of policy {policy!r} "
                f"({self.settings.advantage(policy)}) returned {advantages!r} for a group "
                f"of {len(members)}: one finite number per sample expected"))
        return [float(a) for a in advantages]

    async def _accept(self, req: SubmitIn) -> dict[str, Any]:
        checked = check_trajectories(req.trajectories)
        rec = self._lease_task(req.lease_id)
        if rec is None:
            self.counters["submissions_duplicate"] += 1
            return {"status": "duplicate", "task_id": req.lease_id.rpartition("|")[0]}
        for i, ct in enumerate(checked):
            if ct.task_id != rec.task_id:
                raise ServiceError(
                    422, f"trajectories.{i}.task_id is {ct.task_id!r}, the lease is for "
                    f"{rec.task_id!r}"
                )
            self._policy(ct.policy)
        incoming = Counter(ct.policy for ct in checked)
        overflow = set()
        for policy, n in incoming.items():
            if len(self.fresh[policy]) + n > self.settings.buffer_capacity:
                if self._orphaned(policy):
                    overflow.add(policy)
                    continue
                raise ServiceError(
                    429, f"buffer of policy {policy!r} is full ({len(self.fresh[policy])} of "
                    f"{self.settings.buffer_capacity}); retry after the trainer consumes"
                )
        previous_state = rec.state
        rec.state = "done"  # reserved: a concurrent duplicate now sees the task as done
        node_id = req.node_id or rec.node_id
        node = self.nodes.get(node_id or "")
        labels = node.labels if node else {}
        pool = labels.get("pool", UNKNOWN_POOL)
        now = time.time()
        stamp = {
            "task_type": rec.task.get("task_type", "default"),
            "source_task_id": rec.task.get("metadata", {}).get("source_task_id", rec.task_id),
            "lease_id": req.lease_id,
            "node_id": node_id,
            "pool": pool,
            "region": labels.get("region", "unknown"),
            "leased_at": (rec.deadline or now) - self.settings.lease_seconds,
            "accepted_at": now,
        }
        if self.selectors:
            source_task = Task(**{**rec.task, "task_id": stamp["source_task_id"]})
        groups: dict[tuple[str, str], list[CheckedTrajectory]] = {}
        for ct in checked:
            groups.setdefault((ct.group_id, ct.policy), []).append(ct)
        deltas = Counter(tasks_completed=1)
        accepted = filtered = dropped = 0
        rows: list[tuple] = []
        payloads: list[bytes] = []
        for (group_id, policy), members in groups.items():
            rewards = [ct.reward for ct in members]
            failed = [bool(ct.metadata.get(REWARD_FAILED)) for ct in members]
            deltas[f"produced:{policy}"] += len(members)
            deltas[pool_key("produced", policy, pool)] += len(members)
            deltas[f"reward_failed:{policy}"] += sum(failed)
            if any(failed) and policy not in self.reward_errors:
                first = next(ct for ct, bad in zip(members, failed, strict=True) if bad)
                self.reward_errors[policy] = str(first.metadata.get(REWARD_ERROR, ""))
            for sel in self.selectors:
                sel.observe_group(source_task, policy, rewards)
            if self.filters:
                group: list[Trajectory] = [ct.to_trajectory() for ct in members]
                if not all(f.keep(group) for f in self.filters):
                    deltas[f"filtered:{policy}"] += len(members)
                    filtered += len(members)
                    continue
            if policy in overflow:
                deltas[f"dropped_no_trainer:{policy}"] += len(members)
                dropped += len(members)
                continue
            meta = {**stamp, "group_size": len(members)}
            advantages = self._group_stage(policy, members, rewards, failed)
            for ct, advantage in zip(members, advantages, strict=True):
                if ct.min_version < 0:  # no trained token
                    # a rollout that sampled nothing (an agent that failed before its
                    # first call): counted above, in its group's baseline, never served
                    deltas[f"filtered:{policy}"] += 1
                    filtered += 1
                    continue
                if self._stale(policy, ct.min_version):
                    deltas[f"dropped_stale:{policy}"] += 1
                    deltas[stale_key(policy, pool)] += 1
                    dropped += 1
                    continue
                rows.append((self.next_item, policy, rec.task_id, group_id, FRESH,
                             ct.min_version, pool))
                self.next_item += 1
                payloads.append(ct.payload(advantage, {**ct.metadata, **meta}))
                deltas[f"accepted:{policy}"] += 1
                accepted += 1
        plugins = self._plugin_updates()
        # the payloads are written before the rows that point at them are committed
        locs = self.store.payloads.append(payloads) if payloads else []
        items = [ItemRec(*row[:4], row[5], loc, row[6])
                 for row, loc in zip(rows, locs, strict=True)]

        def job(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO items(id, policy, task_id, group_id, state, min_version, pool, "
                "seg, off, len, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [row + loc for row, loc in zip(rows, locs, strict=True)],
            )
            conn.execute("UPDATE tasks SET state = 'done' WHERE task_id = ?", (rec.task_id,))
            self._save_plugins(conn, plugins)

        committing = Counter(item.policy for item in items)
        self._committing.update(committing)  # admission control counts them meanwhile
        try:
            await self.store.run(job, deltas)
        except Exception:
            rec.state = previous_state
            self.store.payloads.release(locs)
            raise
        finally:
            self._committing.subtract(committing)
        del self.tasks[rec.task_id]
        self.done.add(rec.task_id)
        self.counters.update(deltas)
        for item in items:
            self.fresh[item.policy][item.id] = item
            self.first_accepted.setdefault(item.policy, time.time())
        if accepted:
            self.autoscale.produce(pool, accepted)
        if node_id in self.nodes:
            self.pacing.accepted(rec.task_id, node_id)
            self.timeline.accept(node_id, accepted)
        for policy in {i.policy for i in items}:
            self._pulse_arrival(policy)
        return {
            "status": "accepted",
            "task_id": rec.task_id,
            "accepted": accepted,
            "filtered": filtered,
            "dropped_stale": dropped,
        }
