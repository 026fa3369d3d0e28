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
import dataclasses
import heapq
import itertools
import json
import logging
import math
import sqlite3
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from astraflow.contracts import BatchSampler, DataAlgorithm, TaskSelector, TrajectoryFilter
from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.payloads import Location, PayloadCorrupt
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.store import CONSUMED, FRESH, SERVED, Store, add_counters
from astraflow.dataflow.wire import (
    CheckedTrajectory,
    LeaseIn,
    RegisterIn,
    SubmitIn,
    TasksIn,
    check_trajectories,
    unpack_trajectory,
)
from astraflow.errors import ConfigError
from astraflow.plugins import Registry, get_registry, missing_option_message, typed_config
from astraflow.rewards.base import ERROR as REWARD_ERROR
from astraflow.rewards.base import FAILED as REWARD_FAILED
from astraflow.rl.advantages import group_advantages
from astraflow.types import Task, Trajectory

log = logging.getLogger("astraflow.dataflow")
STORE_ERRORS = (OSError, sqlite3.Error)
#: the pool of a trajectory whose node registered none, or is gone (or from an old store)
UNKNOWN_POOL = "unknown"
#: counters per (policy, pool) are named "<event>_pool:" + JSON [policy, pool]
_POOL_EVENTS = ("produced", "consumed", "dropped_stale")


def _pool_key(event: str, policy: str, pool: str) -> str:
    # JSON: pool names are free text, so no separator could be safe
    return f"{event}_pool:" + json.dumps([policy, pool])


def _stale_key(policy: str, pool: str) -> str:
    return _pool_key("dropped_stale", policy, pool)


def _fraction(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


class ServiceError(Exception):
    """A request the service refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class NodeRec:
    node_id: str
    kind: str
    labels: dict[str, Any]
    state: str  # active | retired | left
    registered_at: float
    last_seen: float  # monotonic


@dataclass
class TaskRec:
    task_id: str
    task: dict[str, Any]  # the Task as issued (task_id is the ledger id)
    state: str  # pending | leased | done
    attempt: int
    node_id: str | None
    deadline: float | None  # unix time
    seq: int


class ItemRec(NamedTuple):
    """A buffered trajectory. Immutable, and a tuple of plain values: the garbage
    collector stops tracking it, so a buffer of 100k items costs its passes nothing."""

    id: int
    policy: str
    task_id: str
    group_id: str
    min_version: int
    #: where the payload lies in the payload log
    loc: Location
    #: the rollout pool of the node that produced it
    pool: str


@dataclass
class BatchRec:
    batch_id: str
    policy: str
    trainer_id: str
    items: list[int]
    replay: list[int]
    trainer_version: int
    created_at: float


def _log_failure(future: asyncio.Future) -> None:
    """Announcements nobody awaits (weights' on_publish) must not fail silently."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("version announcement failed: %s", future.exception())


def _label(value: str) -> str:
    """A Prometheus label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")





class DataflowService:
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
            entry = options.get(name)
            if entry is None:
                raise ConfigError(missing_option_message(registry, "trajectory_filter", name))
            self.algorithms[name] = entry.create(typed_config(entry.config_cls, conf))
        algos = self.algorithms.values()
        self.selectors = [a for a in algos if isinstance(a, TaskSelector)]
        self.filters = [a for a in algos if isinstance(a, TrajectoryFilter)]
        samplers = [name for name, a in self.algorithms.items() if isinstance(a, BatchSampler)]
        if len(samplers) > 1:
            raise ConfigError(
                f"at most one batch sampler can compose batches; got {', '.join(samplers)}: "
                "select one of them"
            )
        self.sampler: BatchSampler | None = self.algorithms[samplers[0]] if samplers else None

        self.store = Store(settings.store_path, settings.synchronous)
        self.counters: Counter = Counter()
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
        self.outstanding: dict[tuple[str, str], BatchRec] = {}
        self.batches: dict[str, BatchRec] = {}
        self.acked: set[str] = set()
        #: accepted items per policy whose commit is under way (not yet in ``fresh``)
        self._committing: Counter = Counter()
        self.next_item = 1
        self.next_seq = 1
        self.epoch = 0
        self.index = 0
        self._source_iter: Iterator[Task] | None = None
        self._plugin_saved: dict[str, str] = {}
        #: the first traceback of a failed reward per policy (for the console and metrics)
        self.reward_errors: dict[str, str] = {}
        self.autoscale = AutoscaleWindow(settings.autoscale_window)
        self.pacing = Pacing()
        #: per policy, how often admission control issued nothing, by reason
        self.refusals: dict[str, Counter] = {p: Counter() for p in self.policies}
        self.started_at = time.time()
        self._load()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._arrival: dict[str, asyncio.Event] = {}
        #: set when the server stops: long polls end at once
        self.closing = False
        self._changed: asyncio.Event | None = None
        #: set (and replaced) when a policy's new version is durable: wakes only the
        #: version long-polls, which every lease and submission would otherwise wake
        self._new_version: asyncio.Event | None = None
        self._reaper: asyncio.Task | None = None
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
            rec = TaskRec(row[0], json.loads(row[1]), *row[2:])
            self.tasks[rec.task_id] = rec
            if rec.state == "pending":
                self.ready.append(rec.task_id)
            else:
                heapq.heappush(self.expiry, (rec.deadline, rec.task_id, rec.attempt))
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
            rec = ItemRec(item_id, policy, task_id, group_id, min_version, tuple(loc),
                          pool or UNKNOWN_POOL)
            if state == FRESH:
                self.fresh[policy][item_id] = rec
            elif state == SERVED:
                served.setdefault(batch_id, []).append(item_id)
                self.in_batches[item_id] = rec
            else:
                self.replayable[policy][item_id] = rec
        for batch_id, policy, trainer_id, state, version, replay, created in conn.execute(
            "SELECT batch_id, policy, trainer_id, state, trainer_version, replay, created_at "
            "FROM batches"
        ):
            if state == "acked":
                self.acked.add(batch_id)
                continue
            rec = BatchRec(
                batch_id, policy, trainer_id, served.get(batch_id, []), json.loads(replay),
                version, created,
            )
            self.outstanding[(policy, trainer_id)] = rec
            self.batches[batch_id] = rec
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
        lost: Counter = Counter()
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

    # ---- nodes -----------------------------------------------------------------------

    async def register(self, req: RegisterIn) -> dict[str, Any]:
        node_id = req.node_id or f"{req.kind}-{uuid.uuid4().hex[:12]}"
        existing = self.nodes.get(node_id)
        if existing is not None and existing.kind != req.kind:
            raise ServiceError(409, f"node {node_id!r} is registered as a {existing.kind}")
        labels = req.labels.model_dump()
        rec = NodeRec(node_id, req.kind, labels, "active", time.time(), time.monotonic())
        await self.store.run(
            lambda c: c.execute(
                "INSERT INTO nodes(node_id, kind, labels, state, registered_at) "
                "VALUES (?, ?, ?, 'active', ?) ON CONFLICT(node_id) DO UPDATE SET "
                "labels = excluded.labels, state = 'active'",
                (node_id, req.kind, json.dumps(labels), rec.registered_at),
            )
        )
        self.nodes[node_id] = rec
        s = self.settings
        return {
            "node_id": node_id,
            "heartbeat_interval": s.heartbeat_timeout / 3,
            "heartbeat_timeout": s.heartbeat_timeout,
            "lease_seconds": s.lease_seconds,
            "group_size": s.group_size,
            "policies": {
                p: {"version": self.versions[p], "max_staleness": m}
                for p, m in self.policies.items()
            },
        }

    def _active(self, node_id: str) -> NodeRec:
        node = self.nodes.get(node_id)
        if node is None or node.state != "active":
            state = "unknown" if node is None else node.state
            raise ServiceError(404, f"node {node_id!r} is not registered ({state}): register again")
        return node

    def _orphaned(self, policy: str) -> bool:
        """Every trainer that ever served ``policy`` is gone (it left or went silent).

        Such a policy must not hold the other policies back: it gets no admission
        budget and its surplus is dropped (and counted) instead of refusing whole
        submissions. A policy whose trainer has not registered yet is not orphaned.
        """
        trainers = [n for n in self.nodes.values()
                    if n.kind == "trainer" and policy in n.labels.get("policies", [])]
        return bool(trainers) and all(n.state != "active" for n in trainers)

    def heartbeat(self, node_id: str) -> dict[str, Any]:
        self._active(node_id).last_seen = time.monotonic()
        return {"node_id": node_id, "versions": self.versions}

    async def leave(self, node_id: str) -> dict[str, Any]:
        node = self._active(node_id)
        await self._retire(node, "left")
        return {"node_id": node_id, "state": "left"}

    async def _retire(self, node: NodeRec, state: str) -> None:
        """Take a node out; its leases become re-issuable at once."""
        node.state = state
        now = time.time()
        for rec in self.tasks.values():
            if rec.state == "leased" and rec.node_id == node.node_id:
                rec.deadline = now
                heapq.heappush(self.expiry, (now, rec.task_id, rec.attempt))
        self._expire()
        deltas = Counter({"nodes_retired": int(state == "retired")})

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE nodes SET state = ? WHERE node_id = ?", (state, node.node_id))

        await self.store.run(job, deltas)
        self.counters.update(deltas)
        self._pulse_changed()

    async def _reap_forever(self) -> None:
        s = self.settings
        interval = max(0.05, min(0.5, s.lease_seconds / 4, s.heartbeat_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                if self._expire():
                    self._pulse_changed()
                horizon = time.monotonic() - s.heartbeat_timeout
                for node in list(self.nodes.values()):
                    if node.state == "active" and node.last_seen < horizon:
                        log.info("node %s missed its heartbeats: retired", node.node_id)
                        await self._retire(node, "retired")
            except STORE_ERRORS:
                log.exception("dataflow reaper failed; retrying")

    # ---- tasks -----------------------------------------------------------------------

    def _expire(self) -> int:
        """Move leases past their deadline back to the front of the queue."""
        now = time.time()
        expired = []
        while self.expiry and self.expiry[0][0] <= now:
            _deadline, task_id, attempt = heapq.heappop(self.expiry)
            rec = self.tasks.get(task_id)
            if rec and rec.state == "leased" and rec.attempt == attempt and rec.deadline <= now:
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

    def _steps_running(self, policy: str) -> int:
        """Batches of ``policy`` being trained on whose new version is not out yet:
        each puts one more version between a queued sample and its consumption."""
        return sum(1 for (p, _t), rec in self.outstanding.items()
                   if p == policy and self.versions[p] == rec.trainer_version)

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
        refresh, one too slow for the bound is told why.
        """
        s = self.settings
        in_flight = sum(1 for r in self.tasks.values() if r.state == "leased")
        allowed = 1 << 30
        reasons: dict[str, str] = {}
        for policy, max_staleness in self.policies.items():
            if self._orphaned(policy):
                continue
            per_task = self._samples_per_task(policy)
            if per_task <= 0:
                continue
            queued = len(self.fresh[policy]) + self._committing[policy] + in_flight * per_task
            lag = max(0, self.versions[policy] - held.get(policy, self.versions[policy]))
            running = self._steps_running(policy)
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
            if n == 0:
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
        give_up = time.monotonic() + req.wait
        cursor_was, skipped_was = (self.epoch, self.index), self.counters["tasks_skipped"]
        while True:
            changed = self._changed
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

    # ---- trajectories ----------------------------------------------------------------

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

    async def _lease_after(self, accept: asyncio.Future, req: LeaseIn) -> dict[str, Any]:
        if accept.done() and (accept.cancelled() or accept.exception() is not None):
            return {}
        try:
            return await self.lease(req)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            return {"leases": [], "backpressure": {"*": str(exc)}}

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
            deltas[_pool_key("produced", policy, pool)] += len(members)
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
            rollouts = [ct.metadata.get("rollout") for ct in members]
            advantages = group_advantages(
                rewards, failed=failed,
                rollouts=rollouts if any(r is not None for r in rollouts) else None,
                rollout_rewards=[float(ct.metadata.get("rollout_reward", ct.reward))
                                 for ct in members])
            for ct, advantage in zip(members, advantages, strict=True):
                if ct.min_version < 0:  # no trained token
                    # a rollout that sampled nothing (an agent that failed before its
                    # first call): counted above, in its group's baseline, never served
                    deltas[f"filtered:{policy}"] += 1
                    filtered += 1
                    continue
                if self._stale(policy, ct.min_version):
                    deltas[f"dropped_stale:{policy}"] += 1
                    deltas[_stale_key(policy, pool)] += 1
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
        if accepted:
            self.autoscale.produce(pool, accepted)
        if node_id in self.nodes:
            self.pacing.accepted(rec.task_id, node_id)
        for policy in {i.policy for i in items}:
            self._pulse_arrival(policy)
        return {
            "status": "accepted",
            "task_id": rec.task_id,
            "accepted": accepted,
            "filtered": filtered,
            "dropped_stale": dropped,
        }

    # ---- batches ---------------------------------------------------------------------

    def _in_order(self, policy: str) -> Iterator[ItemRec]:
        """Fresh items in serving order: arrival (FIFO) or staleness deadline (EDF)."""
        fresh = self.fresh[policy].values()
        if self.settings.order == "fifo":
            return iter(fresh)
        big = 1 << 62
        return iter(sorted(fresh, key=lambda r: (r.min_version if r.min_version >= 0 else big,
                                                  r.id)))


    async def _compose(self, policy: str, n: int) -> tuple[list[int], list[int]] | None:
        """(fresh ids, replayed ids) for a batch of ``n``, or None if not enough yet."""
        fresh = self.fresh[policy]
        if self.sampler is None:
            if len(fresh) < n:
                return None
            return [r.id for r in itertools.islice(self._in_order(policy), n)], []
        pool = self.replayable[policy]
        if not fresh or len(fresh) + len(pool) < n:
            return None
        window = [r.id for r in itertools.islice(self._in_order(policy), max(4 * n, 256))]
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
            self.versions[policy],
        )
        fresh_ids = [ids_of[id(t)] for t in picked_fresh if ids_of.get(id(t)) in fresh]
        replay = [ids_of[id(t)] for t in picked_replay if ids_of.get(id(t)) in pool]
        if len(fresh_ids) + len(replay) != n or not fresh_ids:
            return None
        return fresh_ids, replay

    async def get_batch(self, policy: str, n: int, timeout: float, trainer_id: str
                        ) -> tuple[BatchRec, dict[int, bytes], bool] | None:
        """A batch of ``n`` for ``policy``, waiting up to ``timeout`` for enough items.

        A trainer that asks again before acknowledging its previous batch (it
        restarted, or lost the reply) gets that same batch again.
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
                rec = self.outstanding.get((policy, trainer_id))
                if rec is not None:
                    return rec, await self._batch_payloads(rec), True
                picked = await self._compose(policy, n)
                if picked is not None:
                    rec, payloads = await self._serve(policy, trainer_id, *picked)
                    return rec, payloads, False
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return None
            await self._wait(arrival, remaining)

    async def _batch_payloads(self, rec: BatchRec) -> dict[int, bytes]:
        pool = self.replayable[rec.policy]
        return self._read_payloads([self.in_batches[i] for i in rec.items]
                                   + [pool[i] for i in rec.replay if i in pool])

    async def _serve(self, policy: str, trainer_id: str, ids: list[int], replay: list[int]
                     ) -> tuple[BatchRec, dict[int, bytes]]:
        rec = BatchRec(uuid.uuid4().hex, policy, trainer_id, ids, replay, self.versions[policy],
                       time.time())
        taken = [self.fresh[policy].pop(i) for i in ids]
        self.in_batches.update((item.id, item) for item in taken)
        self.outstanding[(policy, trainer_id)] = rec
        self.batches[rec.batch_id] = rec

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO batches(batch_id, policy, trainer_id, state, trainer_version, "
                "replay, created_at) VALUES (?, ?, ?, 'served', ?, ?, ?)",
                (rec.batch_id, policy, trainer_id, rec.trainer_version, json.dumps(replay),
                 rec.created_at),
            )
            conn.execute(
                "UPDATE items SET state = ?, batch_id = ? "
                "WHERE id IN (SELECT value FROM json_each(?))",
                (SERVED, rec.batch_id, json.dumps(ids)),
            )

        try:
            payloads = self._read_payloads(taken + [self.replayable[policy][i] for i in replay])
            await self.store.run(job)
        except Exception:
            del self.outstanding[(policy, trainer_id)], self.batches[rec.batch_id]
            for item in taken:
                del self.in_batches[item.id]
                self.fresh[policy][item.id] = item
            raise
        return rec, payloads

    async def ack_batch(self, batch_id: str, wait_seconds: float, step_seconds: float
                        ) -> dict[str, Any]:
        """The trainer finished its step on ``batch_id``: its items are consumed."""
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
        deltas.update(_pool_key("consumed", policy, item.pool) for item in trained)
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

        del self.batches[batch_id], self.outstanding[(policy, rec.trainer_id)]
        self.acked.add(batch_id)
        await self.store.run(job, deltas)
        self.store.payloads.release(item.loc for item in evict)
        self.counters.update(deltas)
        self.autoscale.step(wait_seconds, step_seconds, len(rec.items))
        self.pacing.acked(policy, wait_seconds, step_seconds)
        self._pulse_changed()
        return {"status": "acked", "batch_id": batch_id, "consumed": len(rec.items)}

    # ---- versions --------------------------------------------------------------------

    def announce_version(self, policy: str, version: int) -> Any:
        """Record ``policy``'s new weight version (for the weights subsystem's on_publish).

        Callable from the event loop (returns an awaitable) or from any other thread
        (blocks until the version is durable).
        """
        if self.loop is None:
            raise RuntimeError("the dataflow service is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            future = asyncio.ensure_future(self.set_version(policy, version))
            future.add_done_callback(_log_failure)
            return future
        return asyncio.run_coroutine_threadsafe(self.set_version(policy, version),
                                                self.loop).result()

    async def wait_versions(self, have: dict[str, int], wait: float) -> dict[str, int]:
        """Every policy's latest version, as soon as one in ``have`` is newer than the
        version given for it, or after ``wait`` seconds: nodes learn of new weights
        the moment they are published without polling for them."""
        for policy in have:
            self._policy(policy)
        give_up = time.monotonic() + wait
        while True:
            published = self._new_version
            remaining = give_up - time.monotonic()
            if remaining <= 0 or any(self.versions[p] > v for p, v in have.items()):
                return dict(self.versions)
            await self._wait(published, remaining)

    async def set_version(self, policy: str, version: int) -> dict[str, Any]:
        self._policy(policy)
        current = self.versions[policy]
        if version < current:
            raise ServiceError(
                409, f"versions of {policy!r} only move forward: current {current}, got {version}"
            )
        if version == current:
            return {"policy": policy, "version": version, "dropped_stale": 0}
        self.versions[policy] = version
        for algo in self.algorithms.values():
            algo.on_new_version(policy, version)
        stale = [r for r in self.fresh[policy].values() if self._stale(policy, r.min_version)]
        for item in stale:
            del self.fresh[policy][item.id]
        deltas = Counter({f"dropped_stale:{policy}": len(stale)})
        deltas.update(_stale_key(policy, item.pool) for item in stale)
        # consumed items too old to be replayed go as well (trained on, so not counted)
        pool = self.replayable[policy]
        too_old = [r for r in pool.values() if self._stale(policy, r.min_version)]
        for item in too_old:
            del pool[item.id]
        plugins = self._plugin_updates()

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO versions(policy, version) VALUES (?, ?) "
                "ON CONFLICT(policy) DO UPDATE SET version = excluded.version",
                (policy, version),
            )
            conn.execute("DELETE FROM items WHERE id IN (SELECT value FROM json_each(?))",
                         (json.dumps([item.id for item in stale + too_old]),))
            self._save_plugins(conn, plugins)

        await self.store.run(job, deltas)
        self.store.payloads.release(item.loc for item in stale + too_old)
        self.counters.update(deltas)
        self._pulse_changed()
        self._new_version.set()
        self._new_version = asyncio.Event()
        return {"policy": policy, "version": version, "dropped_stale": len(stale)}

    # ---- observability ---------------------------------------------------------------

    def pool_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for node in self.nodes.values():
            if node.kind == "raas" and node.state == "active":
                pool = node.labels.get("pool", "default")
                sizes[pool] = sizes.get(pool, 0) + 1
        return sizes

    def by_pool(self, event: str) -> dict[str, dict[str, int]]:
        """A per-(policy, pool) counter: produced, consumed or dropped_stale samples."""
        prefix = f"{event}_pool:"
        out: dict[str, dict[str, int]] = {p: {} for p in self.policies}
        for name, n in self.counters.items():
            if name.startswith(prefix) and n:
                policy, pool = json.loads(name[len(prefix):])
                if policy in out:
                    out[policy][pool] = n
        return out

    def stale_by_pool(self) -> dict[str, dict[str, int]]:
        """Stale drops per policy and rollout pool: which pool lags too far behind."""
        return self.by_pool("dropped_stale")

    def _yield(self, policy: str, produced: dict[str, int], consumed: dict[str, int],
               stale: dict[str, int]) -> dict[str, Any]:
        """How much of what the nodes generated for ``policy`` was trained on, in all
        and per rollout pool. What is still buffered or in a batch being trained on is
        left out of the fraction (it may yet be trained on) and reported as pending."""
        c = self.counters
        waiting = Counter(item.pool for item in self.fresh[policy].values())
        waiting.update(item.pool for item in self.in_batches.values() if item.policy == policy)
        pending = sum(waiting.values())
        generated, trained = c[f"produced:{policy}"], c[f"consumed:{policy}"]
        return {
            "generated": generated,
            "trained": trained,
            "pending": pending,
            "trained_fraction": _fraction(trained, generated - pending),
            "by_pool": {
                pool: {"generated": produced.get(pool, 0), "trained": consumed.get(pool, 0),
                       "dropped_stale": stale.get(pool, 0),
                       "pending": waiting[pool],
                       "trained_fraction": _fraction(consumed.get(pool, 0),
                                                     produced.get(pool, 0) - waiting[pool])}
                for pool in sorted(set(produced) | set(consumed))
            },
        }

    def status(self) -> dict[str, Any]:
        c = self.counters
        now = time.monotonic()
        stale_by_pool = self.stale_by_pool()
        produced, consumed = self.by_pool("produced"), self.by_pool("consumed")
        leased = Counter(r.node_id for r in self.tasks.values() if r.state == "leased")
        nodes = [
            {
                "node_id": n.node_id,
                "kind": n.kind,
                "state": n.state,
                "labels": n.labels,
                "seconds_since_heartbeat": round(now - n.last_seen, 3),
                **({"in_flight": leased[n.node_id],
                    "turnaround_seconds": self.pacing.turnaround(n.node_id)}
                   if n.kind == "raas" else {}),
            }
            for n in self.nodes.values()
        ]
        pools: dict[str, dict[str, Any]] = {}
        for n in self.nodes.values():
            if n.kind == "raas" and n.state == "active":
                pool = pools.setdefault(n.labels.get("pool", "default"),
                                        {"nodes": 0, "capacity": 0, "regions": []})
                pool["nodes"] += 1
                pool["capacity"] += n.labels.get("capacity", 1)
                if n.labels.get("region") not in pool["regions"]:
                    pool["regions"].append(n.labels.get("region"))
        policies = {
            p: {
                "version": self.versions[p],
                "max_staleness": m,
                "buffered": len(self.fresh[p]),
                "replayable": len(self.replayable[p]),
                "outstanding_batches": sum(1 for k in self.outstanding if k[0] == p),
                "trainer_gone": self._orphaned(p),
                "dropped_stale_by_pool": stale_by_pool[p],
                **{
                    name: c[f"{name}:{p}"]
                    for name in ("accepted", "filtered", "consumed", "dropped_stale",
                                 "dropped_no_trainer", "replayed", "lost", "produced",
                                 "reward_failed")
                },
                "first_reward_error": self.reward_errors.get(p),
                "admission_refusals": dict(self.refusals[p]),
                **self._yield(p, produced[p], consumed[p], stale_by_pool[p]),
            }
            for p, m in self.policies.items()
        }
        return {
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "order": self.settings.order,
            "nodes": nodes,
            "pools": pools,
            "policies": policies,
            "versions": dict(self.versions),
            "tasks": {
                "issued": c["tasks_issued"],
                "leased": c["tasks_leased"],
                "completed": c["tasks_completed"],
                "reissued": c["tasks_reissued"],
                "posted": c["tasks_posted"],
                "skipped": c["tasks_skipped"],
                "in_flight": sum(1 for r in self.tasks.values() if r.state == "leased"),
                "pending": sum(1 for r in self.tasks.values() if r.state == "pending"),
                "duplicate_submissions": c["submissions_duplicate"],
                "epoch": self.epoch,
            },
            "trajectories": {
                name: sum(c[f"{name}:{p}"] for p in self.policies)
                for name in ("accepted", "filtered", "consumed", "dropped_stale",
                                 "dropped_no_trainer", "replayed", "lost")
            },
            "store": {"wal_frames_pending": self.store.wal_frames_pending,
                      "payload_log": self.store.payloads.stats()},
            "source": self.source.stats() if self.source is not None else {},
        }

    def autoscale_report(self) -> dict[str, Any]:
        return self.autoscale.report(self.pool_sizes())

    def metrics(self) -> str:
        """Prometheus text exposition of the counters and gauges in ``status``."""
        st = self.status()
        lines = [
            "# HELP astraflow_tasks_total Task ledger events.",
            "# TYPE astraflow_tasks_total counter",
        ]
        for event in ("issued", "leased", "completed", "reissued", "posted", "skipped"):
            lines.append(f'astraflow_tasks_total{{event="{event}"}} {st["tasks"][event]}')
        lines += ["# HELP astraflow_trajectories_total Trajectory events per policy.",
                  "# TYPE astraflow_trajectories_total counter"]
        gauges: list[str] = []
        for policy, info in st["policies"].items():
            p = _label(policy)
            for event in ("accepted", "filtered", "consumed", "dropped_stale",
                          "dropped_no_trainer", "replayed", "lost"):
                lines.append(
                    f'astraflow_trajectories_total{{policy="{p}",event="{event}"}} {info[event]}'
                )
            gauges.append(f'astraflow_policy_version{{policy="{p}"}} {info["version"]}')
            gauges.append(f'astraflow_buffer_size{{policy="{p}"}} {info["buffered"]}')
        lines += ["# HELP astraflow_policy_version Latest weight version per policy.",
                  "# TYPE astraflow_policy_version gauge",
                  *[g for g in gauges if g.startswith("astraflow_policy_version")],
                  "# HELP astraflow_buffer_size Fresh trajectories buffered per policy.",
                  "# TYPE astraflow_buffer_size gauge",
                  *[g for g in gauges if g.startswith("astraflow_buffer_size")],
                  "# HELP astraflow_tasks_in_flight Tasks currently leased.",
                  "# TYPE astraflow_tasks_in_flight gauge",
                  f"astraflow_tasks_in_flight {st['tasks']['in_flight']}",
                  "# HELP astraflow_pool_nodes Active rollout nodes per pool.",
                  "# TYPE astraflow_pool_nodes gauge"]
        for pool, info in st["pools"].items():
            lines.append(f'astraflow_pool_nodes{{pool="{_label(pool)}"}} {info["nodes"]}')
        lines += ["# HELP astraflow_dropped_stale_total Stale trajectories dropped per policy "
                  "and the rollout pool that produced them.",
                  "# TYPE astraflow_dropped_stale_total counter"]
        for policy, info in st["policies"].items():
            for pool, n in sorted(info["dropped_stale_by_pool"].items()):
                lines.append(f'astraflow_dropped_stale_total{{policy="{_label(policy)}",'
                             f'pool="{_label(pool)}"}} {n}')
        return "\n".join(lines) + "\n"
