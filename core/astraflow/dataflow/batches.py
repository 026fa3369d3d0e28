"""The batch server: composing a policy's batch from its buffer (and replay), serving it
to a trainer, and retiring it on acknowledgement.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack

from astraflow.dataflow.algorithms import Advantages, DataAlgorithms
from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.ledger import Ledger
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.payloads import PayloadCorrupt
from astraflow.dataflow.records import BatchRec, ItemRec, ServiceError, pool_key, stale_key
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.signals import Signals
from astraflow.dataflow.store import CONSUMED, SERVED, Store
from astraflow.dataflow.timeline import Timeline
from astraflow.dataflow.versions import Versions
from astraflow.dataflow.wire import decode_trajectory, reward_failed
from astraflow.types import Trajectory

#: unacknowledged batches one trainer may hold: the one it trains on and the next,
#: fetched while it trains so the step does not wait for the fetch
PIPELINE_DEPTH = 2

Served = tuple[BatchRec, dict[int, bytes], bool]


class BatchServer:
    def __init__(self, *, settings: DataflowSettings, store: Store, ledger: Ledger,
                 versions: Versions, algorithms: DataAlgorithms, advantages: Advantages,
                 signals: Signals, pacing: Pacing, timeline: Timeline,
                 autoscale: AutoscaleWindow) -> None:
        self._settings = settings
        self._store = store
        self._ledger = ledger
        self._versions = versions
        self._algorithms = algorithms
        self._advantages = advantages
        self._signals = signals
        self._pacing = pacing
        self._timeline = timeline
        self._autoscale = autoscale
        #: per policy, the steps its trainer said it has still to take (at its last ack)
        self._steps_left: dict[str, int] = {}

    def steps_left(self, policy: str) -> int | None:
        return self._steps_left.get(policy)

    def unpublished(self, policy: str, held: list[BatchRec]) -> int:
        """Of ``held``, the batches whose step has not published its version yet: each
        puts one more version between a queued sample and the step that trains it."""
        now = self._versions[policy]
        return sum(1 for rec in held if rec.trainer_version >= now)

    async def get_batch(self, policy: str, n: int, timeout: float, trainer_id: str,
                        after: str | None = None) -> Served | None:
        """A batch of ``n`` for ``policy``, waiting up to ``timeout`` for enough items.

        ``after``: the unacknowledged batch the trainer holds, to fetch the next one
        while it trains on it (at most :data:`PIPELINE_DEPTH` held). A trainer asks
        without ``after`` when it has no batch in hand: if it still holds unacknowledged
        ones (it restarted, or lost the reply) it gets the oldest again, and asking after
        it the next, so a restart is served the same batches in the same order.
        """
        self._versions.check(policy)
        if n > self._settings.buffer_capacity:
            raise ServiceError(
                422, f"n={n} exceeds the buffer capacity {self._settings.buffer_capacity}")
        give_up = time.monotonic() + timeout
        while True:
            arrival = self._signals.arrival(policy)
            async with self._signals.policy_lock(policy):
                served = await self._next(policy, n, trainer_id, after)
                if served is not None:
                    return served
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return None
            await self._signals.wait(arrival, remaining)

    async def _next(self, policy: str, n: int, trainer_id: str, after: str | None
                    ) -> Served | None:
        """The batch after ``after`` the trainer holds, or a new one if there is enough."""
        held = self._ledger.held_by(policy, trainer_id)
        ids = [rec.batch_id for rec in held]
        following = ids.index(after) + 1 if after in ids else 0
        if following < len(held):
            rec = held[following]
            return rec, self._served_again(rec), True
        if len(held) >= PIPELINE_DEPTH:
            raise ServiceError(409, (
                f"trainer {trainer_id!r} already holds {len(held)} unacknowledged batches "
                f"of {policy!r} (at most {PIPELINE_DEPTH}): acknowledge {ids[0]} first"))
        # one version later for each of its steps not yet published
        version = self._versions[policy] + self.unpublished(policy, held)
        picked = self._compose(policy, n, version)
        if picked is None:
            return None
        rec = BatchRec(uuid.uuid4().hex, policy, trainer_id, *picked, version, time.time())
        return rec, await self._serve(rec), False

    # ---- composing -------------------------------------------------------------------

    def _in_order(self, policy: str, version: int) -> Iterator[ItemRec]:
        """Fresh items in serving order, arrival (FIFO) or staleness deadline (EDF), that
        are within the staleness bound at ``version`` (the one they would be trained at)."""
        versions = self._versions
        fresh = self._ledger.fresh_items(policy)
        if version > versions[policy]:  # fetched ahead: trained after this step's version
            bound = version - versions.trainable_within(policy)
            fresh = (r for r in fresh if r.min_version < 0 or r.min_version >= bound)
        if self._settings.order == "fifo":
            return fresh
        big = 1 << 62
        return iter(sorted(fresh, key=lambda r: (r.min_version if r.min_version >= 0 else big,
                                                  r.id)))

    def _compose(self, policy: str, n: int, version: int) -> tuple[list[int], list[int]] | None:
        """(fresh ids, replayed ids) for a batch of ``n`` trained at ``version``, or None
        if not enough yet."""
        ledger, sampler = self._ledger, self._algorithms.sampler
        if sampler is None:
            if ledger.buffered(policy) < n:
                return None
            ids = [r.id for r in itertools.islice(self._in_order(policy, version), n)]
            return (ids, []) if len(ids) == n else None
        replay = ledger.replay_items(policy)
        if not ledger.buffered(policy) or ledger.buffered(policy) + len(replay) < n:
            return None
        window = list(itertools.islice(self._in_order(policy, version), max(4 * n, 256)))
        trajs: dict[int, Trajectory] = {}
        for item_id, raw in self._read(window + replay).items():
            data = msgpack.unpackb(raw)
            data.pop("advantage")
            trajs[item_id] = decode_trajectory(data)
        ids_of = {id(t): i for i, t in trajs.items()}
        picked_fresh, picked_replay = sampler.compose(
            n, [trajs[r.id] for r in window], [trajs[r.id] for r in replay], version)
        fresh_ids = [i for t in picked_fresh
                     if (i := ids_of.get(id(t))) is not None
                     and ledger.fresh_item(policy, i) is not None]
        replay_ids = [i for t in picked_replay
                      if (i := ids_of.get(id(t))) is not None
                      and ledger.replay_item(policy, i) is not None]
        if len(fresh_ids) + len(replay_ids) != n or not fresh_ids:
            return None
        return fresh_ids, replay_ids

    # ---- serving ---------------------------------------------------------------------

    def _read(self, items: list[ItemRec]) -> dict[int, bytes]:
        try:
            read = self._store.payloads.read
            return {item.id: read(item.loc) for item in items}
        except PayloadCorrupt as exc:
            raise ServiceError(500, f"the store is damaged: {exc}") from None

    def _served_again(self, rec: BatchRec) -> dict[int, bytes]:
        """The payloads of a batch served before, with the advantages it was served
        with: a batch served again is the same batch."""
        payloads = self._read(self._ledger.served_items(rec))
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
        if not self._advantages.has_batch_stage(rec.policy):
            return payloads
        ids = rec.items + rec.replay
        data = {i: msgpack.unpackb(payloads[i]) for i in ids}
        out = self._advantages.batch(
            rec.policy, [float(data[i]["advantage"]) for i in ids],
            [reward_failed(data[i]) for i in ids])
        rec.advantages = dict(zip(ids, out, strict=True))
        return _stamped(data, rec.advantages)

    async def _serve(self, rec: BatchRec) -> dict[int, bytes]:
        ledger = self._ledger
        taken = ledger.open_batch(rec)

        def job(conn: sqlite3.Connection) -> None:
            advantages = None if rec.advantages is None else json.dumps(rec.advantages)
            conn.execute(
                "INSERT INTO batches(batch_id, policy, trainer_id, state, trainer_version, "
                "replay, created_at, advantages) VALUES (?, ?, ?, 'served', ?, ?, ?, ?)",
                (rec.batch_id, rec.policy, rec.trainer_id, rec.trainer_version,
                 json.dumps(rec.replay), rec.created_at, advantages),
            )
            conn.execute(
                "UPDATE items SET state = ?, batch_id = ? "
                "WHERE id IN (SELECT value FROM json_each(?))",
                (SERVED, rec.batch_id, json.dumps(rec.items)),
            )

        try:
            replayed = [ledger.replay_item(rec.policy, i) for i in rec.replay]
            payloads = self._batch_stage(
                rec, self._read(taken + [item for item in replayed if item is not None]))
            await self._store.run(job)
        except Exception:
            ledger.cancel_batch(rec)
            raise
        return payloads

    # ---- acknowledging ---------------------------------------------------------------

    async def ack(self, batch_id: str, wait_seconds: float, step_seconds: float,
                  metrics: dict[str, float] | None = None, steps_left: int | None = None
                  ) -> tuple[dict[str, Any], str | None]:
        """The trainer finished its step on ``batch_id``: its items are consumed.
        ``metrics`` (the step's reward_mean, loss...) go to the dashboard's series;
        ``steps_left``, the trainer's steps still to come, bound admission. The reply,
        and the batch's policy (None for a batch acknowledged before)."""
        rec = self._ledger.batch(batch_id)
        if rec is None:
            if self._ledger.was_acked(batch_id):
                return {"status": "duplicate", "batch_id": batch_id}, None
            raise ServiceError(404, f"unknown batch {batch_id!r}")
        policy, keep = rec.policy, self._algorithms.sampler is not None
        now = time.time()
        closed = self._ledger.close_batch(rec, keep, self._versions.stale,
                                          self._settings.buffer_capacity, now)
        trained, evict = closed.trained, closed.evict
        deltas = Counter({f"consumed:{policy}": len(rec.items),
                          f"replayed:{policy}": len(rec.replay)})
        deltas.update(pool_key("consumed", policy, item.pool) for item in trained)

        def job(conn: sqlite3.Connection) -> None:
            if keep:
                conn.execute("UPDATE items SET state = ?, batch_id = NULL WHERE batch_id = ?",
                             (CONSUMED, batch_id))
                conn.execute("DELETE FROM items WHERE id IN (SELECT value FROM json_each(?))",
                             (json.dumps([item.id for item in evict]),))
            else:
                conn.execute("DELETE FROM items WHERE batch_id = ?", (batch_id,))
            conn.execute("UPDATE batches SET state = 'acked', acked_at = ? WHERE batch_id = ?",
                         (now, batch_id))

        try:
            await self._store.run(job, deltas)
        except Exception:
            self._ledger.undo_close(closed)  # the trainer's retry acknowledges it again
            raise
        if steps_left is not None:
            self._steps_left[policy] = steps_left
        self._store.payloads.release(item.loc for item in evict)
        self._autoscale.step(wait_seconds, step_seconds, len(rec.items))
        self._pacing.acked(policy, wait_seconds, step_seconds)
        self._timeline.stepped(policy, wait_seconds, step_seconds,
                           [rec.trainer_version - item.min_version for item in trained],
                           metrics or {})
        self._signals.pulse_changed()
        return {"status": "acked", "batch_id": batch_id, "consumed": len(rec.items)}, policy

    async def advance(self, policy: str, version: int) -> dict[str, Any]:
        """``policy`` moves to ``version`` (its trainer published it): the buffered
        samples it makes too stale to serve go, and so do consumed ones too old to be
        replayed."""
        was = self._versions[self._versions.check(policy)]
        if not self._versions.advance(policy, version):
            return {"policy": policy, "version": version, "dropped_stale": 0}
        self._timeline.publish(policy, version)
        self._algorithms.on_new_version(policy, version)
        stale, too_old = self._ledger.drop_stale(policy, self._versions.stale)
        # consumed items too old to be replayed go as well (trained on, so not counted)
        deltas = Counter({f"dropped_stale:{policy}": len(stale)})
        deltas.update(stale_key(policy, item.pool) for item in stale)
        plugins = self._algorithms.updates()
        gone = json.dumps([item.id for item in stale + too_old])

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO versions(policy, version) VALUES (?, ?) "
                "ON CONFLICT(policy) DO UPDATE SET version = excluded.version",
                (policy, version),
            )
            self._versions.save(conn)
            conn.execute("DELETE FROM items WHERE id IN (SELECT value FROM json_each(?))",
                         (gone,))
            self._algorithms.save(conn, plugins)

        try:
            await self._store.run(job, deltas)
        except Exception:
            # the trainer announces the version again: it must find it not yet there
            self._versions.undo_advance(policy, was)
            self._ledger.undo_drop(policy, stale, too_old)
            self._algorithms.unsaved(plugins)
            raise
        self._store.payloads.release(item.loc for item in stale + too_old)
        self._signals.pulse_changed()
        self._signals.pulse_version()
        return {"policy": policy, "version": version, "dropped_stale": len(stale)}


def _stamped(data: dict[int, dict[str, Any]], advantages: dict[int, float]
             ) -> dict[int, bytes]:
    """Decoded payloads packed again, each with its advantage from ``advantages``."""
    return {i: msgpack.packb({**d, "advantage": advantages[i]}) for i, d in data.items()}
