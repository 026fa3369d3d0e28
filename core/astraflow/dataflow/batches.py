"""Batches: composing a policy's batch from its buffer (and replay), serving it
to a trainer and retiring it on acknowledgement.

A part of :class:`~astraflow.dataflow.service.DataflowService`: the state it reads and
writes is set up there.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack

from astraflow.dataflow.records import (
    BatchRec,
    ItemRec,
    ServiceError,
    pool_key,
)
from astraflow.dataflow.store import CONSUMED, SERVED
from astraflow.dataflow.wire import unpack_trajectory
from astraflow.rewards.base import FAILED as REWARD_FAILED
from astraflow.types import Trajectory

#: unacknowledged batches one trainer may hold: the one it trains on and the next,
#: fetched while it trains so the step does not wait for the fetch
PIPELINE_DEPTH = 2


class BatchesMixin:
    """Mixed into DataflowService (see the module's docstring)."""

    def _in_order(self, policy: str, version: int) -> Iterator[ItemRec]:
        """Fresh items in serving order, arrival (FIFO) or staleness deadline (EDF), that
        are within the staleness bound at ``version`` (the one they would be trained at)."""
        fresh: Iterator[ItemRec] = iter(self.fresh[policy].values())
        if version > self.versions[policy]:  # fetched ahead: trained after this step's version
            bound = version - self.policies[policy]
            fresh = (r for r in fresh if r.min_version < 0 or r.min_version >= bound)
        if self.settings.order == "fifo":
            return fresh
        big = 1 << 62
        return iter(sorted(fresh, key=lambda r: (r.min_version if r.min_version >= 0 else big,
                                                  r.id)))

    def _held(self, policy: str) -> list[BatchRec]:
        """Every unacknowledged batch of ``policy``, whichever trainer holds it."""
        return [rec for (p, _t), held in self.outstanding.items() if p == policy
                for rec in held]

    def _unpublished(self, policy: str, held: list[BatchRec]) -> int:
        """Of ``held``, the batches whose step has not published its version yet: each
        puts one more version between a queued sample and the step that trains it."""
        now = self.versions[policy]
        return sum(1 for rec in held if rec.trainer_version >= now)

    def _release(self, rec: BatchRec) -> None:
        """``rec`` is no longer held (acknowledged, or its serving failed)."""
        key = (rec.policy, rec.trainer_id)
        self.outstanding[key].remove(rec)
        if not self.outstanding[key]:
            del self.outstanding[key]
        del self.batches[rec.batch_id]

    async def _compose(self, policy: str, n: int, version: int
                       ) -> tuple[list[int], list[int]] | None:
        """(fresh ids, replayed ids) for a batch of ``n`` trained at ``version``, or None
        if not enough yet."""
        fresh = self.fresh[policy]
        if self.sampler is None:
            if len(fresh) < n:
                return None
            ids = [r.id for r in itertools.islice(self._in_order(policy, version), n)]
            return (ids, []) if len(ids) == n else None
        pool = self.replayable[policy]
        if not fresh or len(fresh) + len(pool) < n:
            return None
        window = [r.id for r in itertools.islice(self._in_order(policy, version),
                                                 max(4 * n, 256))]
        replay_ids = list(pool)
        payloads = self._read_payloads([fresh[i] for i in window] + list(pool.values()))
        trajs: dict[int, Trajectory] = {}
        for item_id, raw in payloads.items():
            data = msgpack.unpackb(raw)
            data.pop("advantage")
            trajs[item_id] = unpack_trajectory(data)
        ids_of = {id(t): i for i, t in trajs.items()}
        picked_fresh, picked_replay = self.sampler.compose(
            n,
            [trajs[i] for i in window if i in trajs],
            [trajs[i] for i in replay_ids if i in trajs],
            version,
        )
        fresh_ids = [ids_of[id(t)] for t in picked_fresh if ids_of.get(id(t)) in fresh]
        replay = [ids_of[id(t)] for t in picked_replay if ids_of.get(id(t)) in pool]
        if len(fresh_ids) + len(replay) != n or not fresh_ids:
            return None
        return fresh_ids, replay

    async def get_batch(self, policy: str, n: int, timeout: float, trainer_id: str,
                        after: str | None = None
                        ) -> tuple[BatchRec, dict[int, bytes], bool] | None:
        """A batch of ``n`` for ``policy``, waiting up to ``timeout`` for enough items.

        ``after``: the unacknowledged batch the trainer holds, to fetch the next one
        while it trains on it (at most :data:`PIPELINE_DEPTH` held). A trainer asks
        without ``after`` when it has no batch in hand: if it still holds unacknowledged
        ones (it restarted, or lost the reply) it gets the oldest again, and asking after
        it the next, so a restart is served the same batches in the same order.
        """
        self._policy(policy)
        if n > self.settings.buffer_capacity:
            raise ServiceError(
                422, f"n={n} exceeds the buffer capacity {self.settings.buffer_capacity}"
            )
        give_up = time.monotonic() + timeout
        while True:
            arrival = self._arrival[policy]
            async with self._policy_locks[policy]:
                held = self.outstanding.get((policy, trainer_id), [])
                ids = [rec.batch_id for rec in held]
                following = ids.index(after) + 1 if after in ids else 0
                if following < len(held):
                    rec = held[following]
                    return rec, await self._batch_payloads(rec), True
                if len(held) >= PIPELINE_DEPTH:
                    raise ServiceError(409, (
                        f"trainer {trainer_id!r} already holds {len(held)} unacknowledged "
                        f"batches of {policy!r} (at most {PIPELINE_DEPTH}): acknowledge "
                        f"{ids[0]} first"))
                # one version later for each of its steps not yet published
                version = self.versions[policy] + self._unpublished(policy, held)
                picked = await self._compose(policy, n, version)
                if picked is not None:
                    rec, payloads = await self._serve(policy, trainer_id, version, *picked)
                    return rec, payloads, False
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return None
            await self._wait(arrival, remaining)

    async def _batch_payloads(self, rec: BatchRec) -> dict[int, bytes]:
        """The payloads of a batch served before, with the advantages it was served
        with: a batch served again is the same batch."""
        pool = self.replayable[rec.policy]
        payloads = self._read_payloads([self.in_batches[i] for i in rec.items]
                                       + [pool[i] for i in rec.replay if i in pool])
        if rec.advantages is None:
            return payloads
        return _stamped({i: msgpack.unpackb(raw) for i, raw in payloads.items()},
                        rec.advantages)

    def _batch_stage(self, rec: BatchRec, payloads: dict[int, bytes]) -> dict[int, bytes]:
        """The payloads of a batch being served, through its policy's estimator's batch
        stage (REINFORCE++'s normalisation over the batch) when it has one: the result is
        recorded in ``rec.advantages`` (and the store), for a batch served again. The
        stored payloads keep the advantages of the group stage, which a replayed
        sample brings to the next batch it is served in."""
        if not self.batch_stages[rec.policy]:
            return payloads
        ids = rec.items + rec.replay
        data = {i: msgpack.unpackb(payloads[i]) for i in ids}
        failed = [bool((data[i].get("metadata") or {}).get(REWARD_FAILED)) for i in ids]
        out = self.estimators[rec.policy].batch_advantages(
            [float(data[i]["advantage"]) for i in ids], failed=failed)
        if len(out) != len(ids) or not all(map(math.isfinite, out)):
            raise ServiceError(500, (
                f"the advantage estimator of policy {rec.policy!r} "
                f"({self.settings.advantage(rec.policy)}) returned {len(out)} advantages "
                f"for a batch of {len(ids)}: one finite number per sample expected"))
        rec.advantages = {i: float(a) for i, a in zip(ids, out, strict=True)}
        return _stamped(data, rec.advantages)

    async def _serve(self, policy: str, trainer_id: str, version: int, ids: list[int],
                     replay: list[int]) -> tuple[BatchRec, dict[int, bytes]]:
        rec = BatchRec(uuid.uuid4().hex, policy, trainer_id, ids, replay, version, time.time())
        taken = [self.fresh[policy].pop(i) for i in ids]
        self.in_batches.update((item.id, item) for item in taken)
        self.outstanding.setdefault((policy, trainer_id), []).append(rec)
        self.batches[rec.batch_id] = rec

        def job(conn: sqlite3.Connection) -> None:
            advantages = None if rec.advantages is None else json.dumps(rec.advantages)
            conn.execute(
                "INSERT INTO batches(batch_id, policy, trainer_id, state, trainer_version, "
                "replay, created_at, advantages) VALUES (?, ?, ?, 'served', ?, ?, ?, ?)",
                (rec.batch_id, policy, trainer_id, rec.trainer_version, json.dumps(replay),
                 rec.created_at, advantages),
            )
            conn.execute(
                "UPDATE items SET state = ?, batch_id = ? "
                "WHERE id IN (SELECT value FROM json_each(?))",
                (SERVED, rec.batch_id, json.dumps(ids)),
            )

        try:
            payloads = self._batch_stage(rec, self._read_payloads(
                taken + [self.replayable[policy][i] for i in replay]))
            await self.store.run(job)
        except Exception:
            self._release(rec)
            for item in taken:
                del self.in_batches[item.id]
                self.fresh[policy][item.id] = item
            raise
        return rec, payloads

    async def ack_batch(self, batch_id: str, wait_seconds: float, step_seconds: float,
                        metrics: dict[str, float] | None = None,
                        steps_left: int | None = None) -> dict[str, Any]:
        """The trainer finished its step on ``batch_id``: its items are consumed.
        ``metrics`` (the step's reward_mean, loss...) go to the dashboard's series;
        ``steps_left``, the trainer's steps still to come, bound admission."""
        rec = self.batches.get(batch_id)
        if rec is None:
            if batch_id in self.acked:
                return {"status": "duplicate", "batch_id": batch_id}
            raise ServiceError(404, f"unknown batch {batch_id!r}")
        policy = rec.policy
        deltas = Counter({f"consumed:{policy}": len(rec.items),
                          f"replayed:{policy}": len(rec.replay)})
        keep = self.sampler is not None
        evict: list[ItemRec] = []
        trained = [self.in_batches.pop(item_id) for item_id in rec.items]
        deltas.update(pool_key("consumed", policy, item.pool) for item in trained)
        if keep:
            # the replay pool holds only what may still be trained on: never a stale item
            pool = self.replayable[policy]
            for item in trained:
                if self._stale(policy, item.min_version):
                    evict.append(item)
                else:
                    pool[item.id] = item
            while len(pool) > self.settings.buffer_capacity:
                evict.append(pool.popitem(last=False)[1])
        else:
            evict = trained

        def job(conn: sqlite3.Connection) -> None:
            if keep:
                conn.execute("UPDATE items SET state = ?, batch_id = NULL WHERE batch_id = ?",
                             (CONSUMED, batch_id))
                conn.execute("DELETE FROM items WHERE id IN (SELECT value FROM json_each(?))",
                             (json.dumps([item.id for item in evict]),))
            else:
                conn.execute("DELETE FROM items WHERE batch_id = ?", (batch_id,))
            conn.execute("UPDATE batches SET state = 'acked' WHERE batch_id = ?", (batch_id,))

        self._release(rec)
        self.acked.add(batch_id)
        if steps_left is not None:
            self.steps_left[policy] = steps_left
        await self.store.run(job, deltas)
        self.store.payloads.release(item.loc for item in evict)
        self.counters.update(deltas)
        self.autoscale.step(wait_seconds, step_seconds, len(rec.items))
        self.pacing.acked(policy, wait_seconds, step_seconds)
        self.timeline.stepped(policy, wait_seconds, step_seconds,
                              [rec.trainer_version - item.min_version for item in trained],
                              metrics or {})
        self._pulse_changed()
        return {"status": "acked", "batch_id": batch_id, "consumed": len(rec.items),
                "ledger": self.ledger(policy)}


def _stamped(data: dict[int, dict[str, Any]], advantages: dict[int, float]
             ) -> dict[int, bytes]:
    """Decoded payloads packed again, each with its advantage from ``advantages``."""
    return {i: msgpack.packb({**d, "advantage": advantages[i]}) for i, d in data.items()}
