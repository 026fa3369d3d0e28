"""The data layer's state: task ledger, leases, per-policy buffers, batches, versions.

State is held in memory for speed and mirrored in the store. Handlers run on the
event-loop thread, so a check and the reservation that follows it (a task marked
done, items taken for a batch) cannot interleave with another request. Each change
is then written by the store's writer, and a request is acknowledged only after the
commit: what a client was told survives a SIGKILL, and what it was not told can be
retried safely because every mutating call is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import sqlite3
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from typing import Any, cast

from astraflow.contracts import (
    AdvantageEstimator,
    BatchSampler,
    DataAlgorithm,
    TaskSelector,
    TrajectoryFilter,
)
from astraflow.contracts.advantage import has_batch_stage
from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.batches import BatchesMixin
from astraflow.dataflow.intake import IntakeMixin
from astraflow.dataflow.leasing import LeasingMixin
from astraflow.dataflow.nodes import NodesMixin
from astraflow.dataflow.observability import ObservabilityMixin
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.payloads import PayloadCorrupt
from astraflow.dataflow.records import (
    UNKNOWN_POOL,
    BatchRec,
    ItemRec,
    NodeRec,
    ServiceError,
    TaskRec,
)
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.store import FRESH, SERVED, Store, add_counters
from astraflow.dataflow.timeline import Timeline
from astraflow.dataflow.versions import VersionsMixin
from astraflow.errors import ConfigError
from astraflow.plugins import Registry, get_registry, missing_option_message, typed_config
from astraflow.types import Task

log = logging.getLogger("astraflow.dataflow")


class DataflowService(NodesMixin, LeasingMixin, IntakeMixin, BatchesMixin, VersionsMixin,
                      ObservabilityMixin):
    """Everything the HTTP routes do, independent of HTTP."""

    def __init__(self, settings: DataflowSettings, registry: Registry | None = None) -> None:
        """``registry`` defaults to the installed plugins' (``astraflow.plugins``)."""
        self.settings = settings
        self.policies = dict(settings.policies)
        registry = registry or get_registry()
        self.source = None
        if settings.task:
            entry = registry.get("task", settings.task["name"])
            self.source = entry.create(typed_config(entry.config_cls, settings.task))
        self.algorithms: dict[str, DataAlgorithm] = {}
        options = registry.group_options("data")
        for name, conf in (settings.data or {}).items():
            option = options.get(name)
            if option is None:
                raise ConfigError(missing_option_message(registry, "trajectory_filter", name))
            self.algorithms[name] = option.create(typed_config(option.config_cls, conf))
        algos = self.algorithms.values()
        self.selectors = [a for a in algos if isinstance(a, TaskSelector)]
        self.filters = [a for a in algos if isinstance(a, TrajectoryFilter)]
        samplers = [name for name, a in self.algorithms.items() if isinstance(a, BatchSampler)]
        if len(samplers) > 1:
            raise ConfigError(
                f"at most one batch sampler can compose batches; got {', '.join(samplers)}: "
                "select one of them"
            )
        self.sampler: BatchSampler | None = (
            cast(BatchSampler, self.algorithms[samplers[0]]) if samplers else None)
        #: per policy, its advantage estimator, and whether it has a batch stage
        self.estimators = {p: _estimator(registry, p, settings.advantage(p))
                           for p in self.policies}
        self.batch_stages = {p: has_batch_stage(e) for p, e in self.estimators.items()}

        self.store = Store(settings.store_path, settings.synchronous)
        self.counters: Counter[str] = Counter()
        self.versions = dict.fromkeys(self.policies, 0)
        self.nodes: dict[str, NodeRec] = {}
        self.tasks: dict[str, TaskRec] = {}  # not yet done
        self.done: set[str] = set()
        self.ready: deque[str] = deque()  # pending task ids, re-issues first
        self.expiry: list[tuple[float, str, int]] = []
        self.fresh: dict[str, dict[int, ItemRec]] = {p: {} for p in self.policies}
        self.replayable: dict[str, OrderedDict[int, ItemRec]] = {
            p: OrderedDict() for p in self.policies
        }
        #: fresh items served in a batch not yet acknowledged
        self.in_batches: dict[int, ItemRec] = {}
        #: per (policy, trainer id), its unacknowledged batches in the order served
        self.outstanding: dict[tuple[str, str], list[BatchRec]] = {}
        self.batches: dict[str, BatchRec] = {}
        self.acked: set[str] = set()
        #: accepted items per policy whose commit is under way (not yet in ``fresh``)
        self._committing: Counter[str] = Counter()
        self.next_item = 1
        self.next_seq = 1
        self.epoch = 0
        self.index = 0
        self._source_iter: Iterator[Task] | None = None
        self._plugin_saved: dict[str, str] = {}
        #: the first traceback of a failed reward per policy (for the console and metrics)
        self.reward_errors: dict[str, str] = {}
        #: when (epoch seconds) this process accepted its first trajectory per policy:
        #: what start-up cost a run, until rollouts flowed
        self.first_accepted: dict[str, float] = {}
        self.autoscale = AutoscaleWindow(settings.autoscale_window)
        self.pacing = Pacing()
        #: the dashboard's series (steps, staleness, evaluations, refreshes)
        self.timeline = Timeline()
        #: per policy, how often admission control issued nothing, by reason
        self.refusals: dict[str, Counter[str]] = {p: Counter() for p in self.policies}
        #: per policy, the steps its trainer said it has still to take (at its last ack)
        self.steps_left: dict[str, int] = {}
        self.started_at = time.time()
        self._load()
        for policy, version in self.versions.items():
            self.timeline.publish(policy, version)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._arrival: dict[str, asyncio.Event] = {}
        #: set when the server stops: long polls end at once
        self.closing = False
        self._changed: asyncio.Event | None = None
        #: set (and replaced) when a policy's new version is durable: wakes only the
        #: version long-polls, which every lease and submission would otherwise wake
        self._new_version: asyncio.Event | None = None
        self._reaper: asyncio.Task[Any] | None = None
        self._policy_locks: dict[str, asyncio.Lock] = {}

    # ---- life cycle ------------------------------------------------------------------

    def _load(self) -> None:
        """Rebuild the in-memory state from the store (after a restart, a crash too)."""
        conn = self.store.conn
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        cursor = json.loads(meta.get("cursor", '{"epoch": 0, "index": 0}'))
        self.epoch, self.index = cursor["epoch"], cursor["index"]
        self.counters.update(dict(conn.execute("SELECT name, value FROM counters")))
        for policy, version in conn.execute("SELECT policy, version FROM versions"):
            if policy in self.versions:
                self.versions[policy] = version
        now = time.monotonic()
        for node_id, kind, labels, state, registered_at in conn.execute(
            "SELECT node_id, kind, labels, state, registered_at FROM nodes"
        ):
            # heartbeats are not persisted: a restart gives every live node a fresh grace period
            self.nodes[node_id] = NodeRec(
                node_id, kind, json.loads(labels), state, registered_at, now
            )
        for row in conn.execute(
            "SELECT task_id, task, state, attempt, node_id, deadline, seq FROM tasks "
            "WHERE state != 'done' ORDER BY seq"
        ):
            task = TaskRec(row[0], json.loads(row[1]), *row[2:])
            self.tasks[task.task_id] = task
            if task.state == "pending":
                self.ready.append(task.task_id)
            else:
                # a leased task has its deadline
                deadline = cast(float, task.deadline)
                heapq.heappush(self.expiry, (deadline, task.task_id, task.attempt))
        self.done = {r[0] for r in conn.execute("SELECT task_id FROM tasks WHERE state = 'done'")}
        self.next_seq = (conn.execute("SELECT max(seq) FROM tasks").fetchone()[0] or 0) + 1
        self._load_payloads()
        served: dict[str, list[int]] = {}
        for (item_id, policy, task_id, group_id, state, batch_id, min_version, pool,
             *loc) in conn.execute(
            "SELECT id, policy, task_id, group_id, state, batch_id, min_version, pool, "
            "seg, off, len, crc FROM items ORDER BY id"
        ):
            self.next_item = item_id + 1
            if policy not in self.policies:
                continue
            item = ItemRec(item_id, policy, task_id, group_id, min_version, tuple(loc),
                          pool or UNKNOWN_POOL)
            if state == FRESH:
                self.fresh[policy][item_id] = item
            elif state == SERVED:
                served.setdefault(batch_id, []).append(item_id)
                self.in_batches[item_id] = item
            else:
                self.replayable[policy][item_id] = item
        for (batch_id, policy, trainer_id, state, version, replay, created,
             advantages) in conn.execute(
            "SELECT batch_id, policy, trainer_id, state, trainer_version, replay, created_at, "
            "advantages FROM batches ORDER BY rowid"
        ):
            if state == "acked":
                self.acked.add(batch_id)
                continue
            batch = BatchRec(
                batch_id, policy, trainer_id, served.get(batch_id, []), json.loads(replay),
                version, created,
                {int(i): a for i, a in json.loads(advantages).items()} if advantages else None,
            )
            self.outstanding.setdefault((policy, trainer_id), []).append(batch)
            self.batches[batch_id] = batch
        for name, state in conn.execute("SELECT name, state FROM plugin_state"):
            if name in self.algorithms:
                self.algorithms[name].load_state_dict(json.loads(state))
                self._plugin_saved[name] = state

    def _load_payloads(self) -> None:
        """Move payloads of a store from before the payload log into it, count every
        row's payload, and check them all if the previous process did not close the log.

        After a SIGKILL every check passes. A payload that fails its checksum can only
        be one a power cut took (``synchronous=NORMAL``): its row goes, counted as
        ``lost``.
        """
        conn, log_ = self.store.conn, self.store.payloads
        legacy = conn.execute("SELECT id, payload FROM items WHERE seg IS NULL").fetchall()
        if legacy:
            locs = log_.append([bytes(p) for _id, p in legacy])
            log_.sync()
            with conn:
                conn.execute("BEGIN")
                conn.executemany(
                    "UPDATE items SET payload = NULL, seg = ?, off = ?, len = ?, crc = ? "
                    "WHERE id = ?",
                    [(*loc, item_id) for (item_id, _p), loc in zip(legacy, locs, strict=True)],
                )
            log_.release(locs)
            log.info("moved %d payloads from the database into the payload log", len(legacy))
        referenced = {seg for (seg,) in conn.execute("SELECT DISTINCT seg FROM items")}
        lost: Counter[str] = Counter()
        bad: list[int] = []
        if log_.recovering or not referenced <= set(log_.segments_on_disk()):
            for item_id, policy, *loc in conn.execute(
                "SELECT id, policy, seg, off, len, crc FROM items ORDER BY seg, off"
            ):
                try:
                    log_.read(tuple(loc))
                except PayloadCorrupt:
                    bad.append(item_id)
                    lost[f"lost:{policy}"] += 1
        if bad:
            log.error("%d buffered trajectories were lost: their payloads did not reach the "
                      "disk (a power cut under synchronous=NORMAL?)", len(bad))
            with conn:
                conn.execute("BEGIN")
                conn.execute("DELETE FROM items WHERE id IN (SELECT value FROM json_each(?))",
                              (json.dumps(bad),))
                add_counters(conn, lost)
            self.counters.update(lost)
        log_.hold(conn.execute("SELECT seg, off, len, crc FROM items"))
        log_.reclaim_unreferenced()

    def _read_payloads(self, items: list[ItemRec]) -> dict[int, bytes]:
        try:
            read = self.store.payloads.read
            return {item.id: read(item.loc) for item in items}
        except PayloadCorrupt as exc:
            raise ServiceError(500, f"the store is damaged: {exc}") from None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._arrival = {p: asyncio.Event() for p in self.policies}
        self._policy_locks = {p: asyncio.Lock() for p in self.policies}
        self._changed = asyncio.Event()
        self._new_version = asyncio.Event()
        self.store.start()
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        self.store.flush()  # inline commits still queued on this loop
        await asyncio.to_thread(self.store.close)

    # ---- helpers ---------------------------------------------------------------------

    def _pulse_changed(self) -> None:
        """Wake lease long-polls: capacity, versions or the task queue changed."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _pulse_arrival(self, policy: str) -> None:
        self._arrival[policy].set()
        self._arrival[policy] = asyncio.Event()

    async def _wait(self, event: asyncio.Event, timeout: float) -> None:
        if self.closing:
            raise ServiceError(503, "the data layer is shutting down; retry")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        if self.closing:
            raise ServiceError(503, "the data layer is shutting down; retry")

    def close_waits(self) -> None:
        """End every long poll now (a 503 its client retries): the server is stopping,
        and a poll left waiting would hold its shutdown for the whole grace period."""
        self.closing = True
        for event in (self._changed, self._new_version, *self._arrival.values()):
            if event is not None:
                event.set()

    def _plugin_updates(self) -> list[tuple[str, str]]:
        """Plug-in states that changed since they were last written."""
        out = []
        for name, algo in self.algorithms.items():
            state = json.dumps(algo.state_dict(), sort_keys=True)
            if state != self._plugin_saved.get(name):
                self._plugin_saved[name] = state
                out.append((name, state))
        return out

    @staticmethod
    def _save_plugins(conn: sqlite3.Connection, updates: list[tuple[str, str]]) -> None:
        conn.executemany(
            "INSERT INTO plugin_state(name, state) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET state = excluded.state",
            updates,
        )

    def _policy(self, policy: str) -> str:
        if policy not in self.policies:
            raise ServiceError(
                404, f"unknown policy {policy!r}; this run has {sorted(self.policies)}"
            )
        return policy

    def _stale(self, policy: str, min_version: int) -> bool:
        return min_version >= 0 and self.versions[policy] - min_version > self.policies[policy]


def _estimator(registry: Registry, policy: str, name: str) -> AdvantageEstimator:
    """``policy``'s advantage estimator, built with its registered config's defaults."""
    entries = registry.entries["advantage_estimator"]
    if name not in entries:
        raise ConfigError(missing_option_message(registry, "advantage_estimator", name,
                                                 key=f"policies.{policy}.advantage"))
    entry = entries[name]
    estimator: AdvantageEstimator = entry.create(typed_config(entry.config_cls, None))
    return estimator
