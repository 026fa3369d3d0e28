"""The data layer: everything its HTTP routes do, independent of HTTP.

:class:`DataflowService` builds the collaborators that own the state -- the task queue,
the ledger of trajectories and batches, the nodes, the versions, the data algorithms
-- and those that act on it -- leasing (admission control is a pure function it
calls), the intake pipeline, the batch server, the status view -- and answers each
request by calling them. They know each other only by their public methods.

State is held in memory for speed and mirrored in the store. Handlers run on the
event-loop thread, so a check and the reservation that follows it (a task marked
done, items taken for a batch) cannot interleave with another request. Each change
is then written by the store's writer, and a request is acknowledged only after the
commit: what a client was told survives a SIGKILL, and what it was not told can be
retried safely because every mutating call is idempotent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections import Counter
from typing import Any

from astraflow.dataflow.algorithms import Advantages, DataAlgorithms
from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.batches import BatchServer, Served
from astraflow.dataflow.intake import Intake
from astraflow.dataflow.leasing import Leasing
from astraflow.dataflow.ledger import Ledger
from astraflow.dataflow.nodes import Nodes
from astraflow.dataflow.overload import Overload
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.records import STORE_ERRORS, ServiceError, log_failure
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.signals import Signals
from astraflow.dataflow.status import StatusView
from astraflow.dataflow.store import Store, StoreDamaged
from astraflow.dataflow.tasks import TaskQueue
from astraflow.dataflow.timeline import Timeline
from astraflow.dataflow.versions import Versions
from astraflow.dataflow.wire import LeaseIn, RegisterIn, SubmitIn, TasksIn
from astraflow.plugins import Registry, get_registry, typed_config

log = logging.getLogger("astraflow.dataflow")


#: a gap this long between two of the reaper's ticks is the data layer's own absence
STALL_SECONDS = 2.0


class DataflowService:
    """Everything the HTTP routes do, independent of HTTP."""

    def __init__(self, settings: DataflowSettings, registry: Registry | None = None) -> None:
        """``registry`` defaults to the installed plugins' (``astraflow.plugins``)."""
        self.settings = s = settings
        registry = registry or get_registry()
        source = None
        if s.task:
            entry = registry.get("task", s.task["name"])
            source = entry.create(typed_config(entry.config_cls, s.task))
        self.algorithms = DataAlgorithms(registry, s.data or {})
        self.advantages = Advantages(registry, {p: s.advantage(p) for p in s.policies})
        self.store = Store(s.store_path, s.synchronous)
        #: the store's counters (it adds to them as it commits)
        self.counters = self.store.counters
        self.tasks = TaskQueue(source)
        self.ledger = Ledger(s.policies)
        self.pacing = Pacing()
        self.versions = Versions(s.policies, lambda policy: (
            self.pacing.turnaround_spread(), self.pacing.compute_interval(policy)))
        self.signals = Signals(s.policies)
        self.nodes = Nodes(self.store, self.tasks, self.signals)
        self.autoscale = AutoscaleWindow(s.autoscale_window)
        #: the dashboard's series (steps, staleness, evaluations, refreshes)
        self.timeline = Timeline()
        #: sheds leases while the event loop cannot keep up (thousands of nodes)
        self.overload = Overload(s.overload_lag, min(1.0, s.lease_seconds / 4),
                                 self.tasks.in_flight)
        self.batches = BatchServer(
            settings=s, store=self.store, ledger=self.ledger, versions=self.versions,
            algorithms=self.algorithms, advantages=self.advantages, signals=self.signals,
            pacing=self.pacing, timeline=self.timeline, autoscale=self.autoscale)
        self.leasing = Leasing(
            self.batches, settings=s, store=self.store, tasks=self.tasks, ledger=self.ledger,
            nodes=self.nodes, versions=self.versions, algorithms=self.algorithms,
            signals=self.signals, pacing=self.pacing, timeline=self.timeline,
            overload=self.overload)
        self.intake = Intake(
            settings=s, store=self.store, tasks=self.tasks, ledger=self.ledger,
            nodes=self.nodes, versions=self.versions, algorithms=self.algorithms,
            advantages=self.advantages, signals=self.signals, pacing=self.pacing,
            timeline=self.timeline, autoscale=self.autoscale)
        self.view = StatusView(
            self.intake, self.leasing, settings=s, store=self.store, tasks=self.tasks,
            ledger=self.ledger, nodes=self.nodes, versions=self.versions, pacing=self.pacing,
            autoscale=self.autoscale, overload=self.overload)
        self._load()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._reaper: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[Any] | None = None

    # ---- life cycle ------------------------------------------------------------------

    def _load(self) -> None:
        """Rebuild the in-memory state from the store (after a restart, a crash too); a
        store that cannot be read stops the data layer, naming the file."""
        try:
            self._read_store()
        except sqlite3.DatabaseError as exc:
            self.store.abandon()
            raise StoreDamaged(self.store.path, str(exc)) from None
        except StoreDamaged:
            self.store.abandon()
            raise

    def _read_store(self) -> None:
        conn = self.store.conn
        for part in (self.versions, self.nodes, self.tasks):
            part.load(conn)
        self.store.load()
        self.ledger.load(conn)
        self.algorithms.load(conn)
        for policy, version in self.versions.all().items():
            self.timeline.publish(policy, version)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.signals.start()
        self.store.start()
        self._reaper = asyncio.create_task(self._reap_forever())
        self._watcher = asyncio.create_task(self.overload.watch())

    async def stop(self) -> None:
        for task in (self._reaper, self._watcher):
            if task is not None:
                task.cancel()
        self._reaper = self._watcher = None
        self.store.flush()  # inline commits still queued on this loop
        await asyncio.to_thread(self.store.close)

    def close_waits(self) -> None:
        """End every long poll now (a 503 its client retries): the server is stopping."""
        self.signals.close()

    async def _reap_forever(self) -> None:
        """Expire leases past their deadline; retire nodes that missed their heartbeats;
        forget what is older than ``retain_seconds``."""
        s = self.settings
        interval = max(0.05, min(0.5, s.lease_seconds / 4, s.heartbeat_timeout / 4))
        retain_every, retained = max(0.5, min(60.0, s.retain_seconds / 10)), time.monotonic()
        ticked = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            stalled, ticked = now - ticked - interval, now
            try:
                if stalled >= STALL_SECONDS:
                    await self._excuse(stalled)
                if self.tasks.expire(time.time()):
                    self.signals.pulse_changed()
                timeout = 3 * self.nodes.heartbeat_interval(s.heartbeat_timeout)
                for node in self.nodes.silent(time.monotonic() - timeout):
                    log.info("node %s missed its heartbeats: retired", node.node_id)
                    await self.nodes.retire(node, "retired")
                if time.monotonic() - retained >= retain_every:
                    retained = time.monotonic()
                    await self._forget_old()
            except STORE_ERRORS:
                log.exception("dataflow reaper failed; retrying")

    async def _excuse(self, stalled: float) -> None:
        """The data layer did not run for ``stalled`` seconds (stopped, or its machine
        stalled): nobody could heartbeat or hand in a lease meanwhile, so node heartbeats
        and lease deadlines are moved on by as much, not held against the nodes."""
        log.warning("the data layer did not run for %.1f s (stopped, or its machine "
                    "stalled): node heartbeats and lease deadlines extended by as much",
                    stalled)
        self.nodes.excuse(stalled)
        leases = self.tasks.postpone(stalled)

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE tasks SET deadline = deadline + ? WHERE state = 'leased'",
                         (stalled,))

        await self.store.run(job, Counter(stalls=1))
        log.info("%d leases extended", leases)

    async def _forget_old(self) -> None:
        """Done tasks, acknowledged batches and departed rollout nodes older than
        ``retain_seconds`` leave memory and the store: a long run stays bounded."""
        retain = self.settings.retain_seconds
        before, before_mono = time.time() - retain, time.monotonic() - retain
        tasks, batches = self.tasks.forget_done(before), self.ledger.forget_acked(before)
        nodes = self.nodes.forget_departed(before_mono)
        self.pacing.forget(before_mono, nodes)
        for node_id in nodes:
            self.timeline.forget_node(node_id)
        if not (tasks or batches or nodes):
            return

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM tasks WHERE state = 'done' AND done_at < ?", (before,))
            conn.execute("DELETE FROM batches WHERE state = 'acked' AND acked_at < ?",
                         (before,))
            conn.execute("DELETE FROM nodes WHERE node_id IN (SELECT value FROM json_each(?))",
                         (json.dumps(nodes),))

        await self.store.run(job, Counter(tasks_forgotten=tasks, batches_forgotten=batches,
                                          nodes_forgotten=len(nodes)))

    # ---- nodes -----------------------------------------------------------------------

    async def register(self, req: RegisterIn) -> dict[str, Any]:
        node = await self.nodes.register(req)
        s = self.settings
        return {
            "node_id": node.node_id,
            "heartbeat_interval": (interval := self.nodes.heartbeat_interval(
                s.heartbeat_timeout)),
            "heartbeat_timeout": 3 * interval,
            "lease_seconds": s.lease_seconds,
            "group_size": s.group_size,
            "policies": {p: {"version": v, "max_staleness": self.versions.max_staleness(p)}
                         for p, v in self.versions.all().items()},
        }

    def heartbeat(self, node_id: str) -> dict[str, Any]:
        self.nodes.heartbeat(node_id)
        return {"node_id": node_id, "versions": self.versions.all(),
                "heartbeat_interval": self.nodes.heartbeat_interval(
                    self.settings.heartbeat_timeout)}

    async def leave(self, node_id: str) -> dict[str, Any]:
        await self.nodes.retire(self.nodes.active(node_id), "left")
        return {"node_id": node_id, "state": "left"}

    # ---- tasks and trajectories ------------------------------------------------------

    async def lease(self, req: LeaseIn) -> dict[str, Any]:
        return await self.leasing.lease(req)

    async def post_tasks(self, req: TasksIn) -> dict[str, Any]:
        return await self.leasing.post_tasks(req)

    async def submit(self, req: SubmitIn) -> dict[str, Any]:
        """Accept every policy's trajectories of one leased task, exactly once; then,
        if asked, lease the node more tasks (one round trip per task for a busy node).

        The leases never fail an accepted submission: a node the service no longer
        knows gets none, and a reason, and registers again on its next lease call.
        """
        if req.lease is None:
            return await self.intake.accept(req)
        if req.node_id is None:
            raise ServiceError(422, "lease: leasing more tasks needs the node_id")
        # both run up to their commit in this pass of the loop, so they share one
        # transaction; the lease looks first whether the submission was refused
        accept = asyncio.ensure_future(self.intake.accept(req))
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

    async def _lease_after(self, accept: asyncio.Future[Any], req: LeaseIn) -> dict[str, Any]:
        if accept.done() and (accept.cancelled() or accept.exception() is not None):
            return {}
        try:
            return await self.leasing.lease(req)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            return {"leases": [], "backpressure": {"*": str(exc)}}

    # ---- batches ---------------------------------------------------------------------

    async def get_batch(self, policy: str, n: int, timeout: float, trainer_id: str,
                        after: str | None = None) -> Served | None:
        return await self.batches.get_batch(policy, n, timeout, trainer_id, after)

    async def ack_batch(self, batch_id: str, wait_seconds: float, step_seconds: float,
                        metrics: dict[str, float] | None = None,
                        steps_left: int | None = None) -> dict[str, Any]:
        """The trainer's step on ``batch_id`` is done; the reply carries the ledger of
        its policy, which the trainer records."""
        out, policy = await self.batches.ack(batch_id, wait_seconds, step_seconds, metrics,
                                             steps_left)
        return out if policy is None else {**out, "ledger": self.view.ledger(policy)}

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
            future.add_done_callback(log_failure)
            return future
        return asyncio.run_coroutine_threadsafe(self.set_version(policy, version),
                                                self.loop).result()

    async def wait_versions(self, have: dict[str, int], wait: float) -> dict[str, int]:
        """Every policy's latest version, as soon as one in ``have`` is newer than the
        version given for it, or after ``wait`` seconds: nodes learn of new weights
        the moment they are published without polling for them."""
        for policy in have:
            self.versions.check(policy)
        give_up = time.monotonic() + wait
        while True:
            published = self.signals.new_version()
            remaining = give_up - time.monotonic()
            if remaining <= 0 or self.versions.newer(have):
                return self.versions.all()
            await self.signals.wait(published, remaining)

    async def set_version(self, policy: str, version: int) -> dict[str, Any]:
        """``policy`` moves to ``version``: what it makes too stale goes
        (:meth:`BatchServer.advance`)."""
        return await self.batches.advance(policy, version)

    def evaluated(self, policy: str, version: int, metrics: dict[str, float]
                  ) -> dict[str, Any]:
        """An evaluator's held-out scores of ``policy`` at ``version`` (for the dashboard)."""
        self.versions.check(policy)
        self.timeline.evaluated(policy, version, metrics)
        return {"policy": policy, "version": version}

    # ---- what it reports -------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.view.status()

    def autoscale_report(self) -> dict[str, Any]:
        return self.view.autoscale_report()

    def metrics(self) -> str:
        return self.view.metrics()
