"""The ledger of trajectories: each policy's buffer of fresh ones, its replay pool, the
ones in batches served and not yet acknowledged, and those batches.

An item moves fresh -> in a batch -> acknowledged (then gone, or replayable while a
batch sampler may serve it again). The ledger holds the state and answers what is
where; what is written to the store, and when, is its callers' to decide.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from astraflow.dataflow.records import UNKNOWN_POOL, BatchRec, ItemRec, Remembered
from astraflow.dataflow.store import FRESH, SERVED

#: is an item of this policy, generated from this version, too stale to train on?
StaleRule = Callable[[str, int], bool]


@dataclass
class Closed:
    """An acknowledged batch taken out of the ledger: its items trained, those to evict,
    and what :meth:`Ledger.undo_close` needs to put it back if the commit fails."""

    rec: BatchRec
    trained: list[ItemRec]
    evict: list[ItemRec]
    #: where the batch stood among its trainer's unacknowledged ones
    position: int
    #: replayable items pushed out of the pool by the trained ones, oldest first
    pushed_out: list[ItemRec]


class Ledger:
    def __init__(self, policies: Iterable[str]) -> None:
        self._fresh: dict[str, dict[int, ItemRec]] = {p: {} for p in policies}
        self._replayable: dict[str, OrderedDict[int, ItemRec]] = {
            p: OrderedDict() for p in self._fresh}
        #: fresh items served in a batch not yet acknowledged
        self._in_batches: dict[int, ItemRec] = {}
        #: per (policy, trainer id), its unacknowledged batches in the order served
        self._outstanding: dict[tuple[str, str], list[BatchRec]] = {}
        self._batches: dict[str, BatchRec] = {}
        #: acknowledged batches, and when each was: what retention forgets
        self._acked = Remembered()
        #: accepted items per policy whose commit is under way (not yet fresh)
        self._committing: Counter[str] = Counter()
        self._next_item = 1

    def load(self, conn: sqlite3.Connection) -> None:
        """Rebuild the ledger from the store (after a restart, a crash too)."""
        served: dict[str, list[int]] = {}
        for (item_id, policy, task_id, group_id, state, batch_id, min_version, pool,
             *loc) in conn.execute(
            "SELECT id, policy, task_id, group_id, state, batch_id, min_version, pool, "
            "seg, off, len, crc FROM items ORDER BY id"
        ):
            self._next_item = item_id + 1
            if policy not in self._fresh:
                continue
            item = ItemRec(item_id, policy, task_id, group_id, min_version, tuple(loc),
                           pool or UNKNOWN_POOL)
            if state == FRESH:
                self._fresh[policy][item_id] = item
            elif state == SERVED:
                served.setdefault(batch_id, []).append(item_id)
                self._in_batches[item_id] = item
            else:
                self._replayable[policy][item_id] = item
        now = time.time()
        for (batch_id, policy, trainer_id, state, version, replay, created,
             advantages, acked_at) in conn.execute(
            "SELECT batch_id, policy, trainer_id, state, trainer_version, replay, created_at, "
            "advantages, acked_at FROM batches ORDER BY rowid"
        ):
            if state == "acked":
                self._acked.add(batch_id, now if acked_at is None else acked_at)
                continue
            rec = BatchRec(
                batch_id, policy, trainer_id, served.get(batch_id, []), json.loads(replay),
                version, created,
                {int(i): a for i, a in json.loads(advantages).items()} if advantages else None,
            )
            self._outstanding.setdefault((policy, trainer_id), []).append(rec)
            self._batches[batch_id] = rec

    # ---- fresh items -----------------------------------------------------------------

    def buffered(self, policy: str) -> int:
        return len(self._fresh[policy])

    def committing(self, policy: str) -> int:
        return self._committing[policy]

    def replayable(self, policy: str) -> int:
        return len(self._replayable[policy])

    def new_item_id(self) -> int:
        item_id, self._next_item = self._next_item, self._next_item + 1
        return item_id

    def begin_commit(self, per_policy: Counter[str]) -> None:
        """Items on their way to the store: admission control counts them meanwhile."""
        self._committing.update(per_policy)

    def end_commit(self, per_policy: Counter[str]) -> None:
        self._committing.subtract(per_policy)

    def add_fresh(self, items: Iterable[ItemRec]) -> None:
        for item in items:
            self._fresh[item.policy][item.id] = item

    def fresh_items(self, policy: str) -> Iterator[ItemRec]:
        """Fresh items of ``policy`` in arrival order."""
        return iter(self._fresh[policy].values())

    def fresh_item(self, policy: str, item_id: int) -> ItemRec | None:
        return self._fresh[policy].get(item_id)

    def replay_items(self, policy: str) -> list[ItemRec]:
        """The replay pool of ``policy``, oldest first."""
        return list(self._replayable[policy].values())

    def replay_item(self, policy: str, item_id: int) -> ItemRec | None:
        return self._replayable[policy].get(item_id)

    def waiting_per_pool(self, policy: str) -> Counter[str]:
        """Items of ``policy`` that may yet be trained on (fresh or in a batch), per pool."""
        waiting = Counter(item.pool for item in self._fresh[policy].values())
        waiting.update(item.pool for item in self._in_batches.values() if item.policy == policy)
        return waiting

    def drop_stale(self, policy: str, stale: StaleRule) -> tuple[list[ItemRec], list[ItemRec]]:
        """Take out the fresh items of ``policy`` too stale to train on, and replayable
        ones too old to be served again: (dropped fresh, dropped replayable)."""
        fresh, pool = self._fresh[policy], self._replayable[policy]
        dropped = [r for r in fresh.values() if stale(policy, r.min_version)]
        for item in dropped:
            del fresh[item.id]
        too_old = [r for r in pool.values() if stale(policy, r.min_version)]
        for item in too_old:
            del pool[item.id]
        return dropped, too_old

    # ---- batches ---------------------------------------------------------------------

    def batch(self, batch_id: str) -> BatchRec | None:
        return self._batches.get(batch_id)

    def was_acked(self, batch_id: str) -> bool:
        return batch_id in self._acked

    def held(self, policy: str) -> list[BatchRec]:
        """Every unacknowledged batch of ``policy``, whichever trainer holds it."""
        return [rec for (p, _t), held in self._outstanding.items() if p == policy
                for rec in held]

    def held_by(self, policy: str, trainer_id: str) -> list[BatchRec]:
        """The unacknowledged batches of one trainer, in the order served."""
        return list(self._outstanding.get((policy, trainer_id), []))

    def served_items(self, rec: BatchRec) -> list[ItemRec]:
        """The items of a batch served and not yet acknowledged: fresh ones, then the
        replayed ones still in the pool."""
        pool = self._replayable[rec.policy]
        return ([self._in_batches[i] for i in rec.items]
                + [pool[i] for i in rec.replay if i in pool])

    def open_batch(self, rec: BatchRec) -> list[ItemRec]:
        """Serve ``rec``: its fresh items leave the buffer; they are returned."""
        fresh = self._fresh[rec.policy]
        taken = [fresh.pop(i) for i in rec.items]
        self._in_batches.update((item.id, item) for item in taken)
        self._outstanding.setdefault((rec.policy, rec.trainer_id), []).append(rec)
        self._batches[rec.batch_id] = rec
        return taken

    def cancel_batch(self, rec: BatchRec) -> None:
        """Serving ``rec`` failed: its items are fresh again."""
        self._release(rec)
        fresh = self._fresh[rec.policy]
        for item_id in rec.items:
            fresh[item_id] = self._in_batches.pop(item_id)

    def close_batch(self, rec: BatchRec, keep: bool, stale: StaleRule, capacity: int,
                    when: float) -> Closed:
        """``rec`` was acknowledged (at ``when``): its items are trained. With ``keep``
        (a batch sampler replays), the trained ones join the replay pool unless stale,
        and the oldest go past ``capacity``; else every trained item goes."""
        position = self._release(rec)
        self._acked.add(rec.batch_id, when)
        trained = [self._in_batches.pop(item_id) for item_id in rec.items]
        if not keep:
            return Closed(rec, trained, trained, position, [])
        evict: list[ItemRec] = []
        pool = self._replayable[rec.policy]
        for item in trained:
            if stale(rec.policy, item.min_version):
                evict.append(item)
            else:
                pool[item.id] = item
        pushed_out = []
        while len(pool) > capacity:
            pushed_out.append(pool.popitem(last=False)[1])
        return Closed(rec, trained, evict + pushed_out, position, pushed_out)

    def undo_close(self, closed: Closed) -> None:
        """The acknowledgement was not committed: the batch is outstanding again, as it
        was."""
        rec, pool = closed.rec, self._replayable[closed.rec.policy]
        for item in closed.trained:
            pool.pop(item.id, None)
            self._in_batches[item.id] = item
        for item in reversed(closed.pushed_out):
            pool[item.id] = item
            pool.move_to_end(item.id, last=False)
        self._acked.discard_last(rec.batch_id)
        self._outstanding.setdefault((rec.policy, rec.trainer_id), []).insert(
            closed.position, rec)
        self._batches[rec.batch_id] = rec

    def forget_acked(self, before: float) -> int:
        """Forget the batches acknowledged before ``before`` (an acknowledgement sent
        again after that is refused as unknown); how many."""
        return self._acked.forget(before)

    def acked_count(self) -> int:
        return len(self._acked)

    def undo_drop(self, policy: str, dropped: list[ItemRec], too_old: list[ItemRec]) -> None:
        """Put back what :meth:`drop_stale` took out (the version was not committed),
        in arrival order."""
        fresh, pool = self._fresh[policy], self._replayable[policy]
        fresh.update((item.id, item) for item in dropped)
        self._fresh[policy] = dict(sorted(fresh.items()))
        pool.update((item.id, item) for item in too_old)
        self._replayable[policy] = OrderedDict(sorted(pool.items()))

    def _release(self, rec: BatchRec) -> int:
        """Take ``rec`` out of the outstanding batches; where it stood among its
        trainer's."""
        key = (rec.policy, rec.trainer_id)
        position = self._outstanding[key].index(rec)
        del self._outstanding[key][position]
        if not self._outstanding[key]:
            del self._outstanding[key]
        del self._batches[rec.batch_id]
        return position
