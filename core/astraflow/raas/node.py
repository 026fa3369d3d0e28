"""The RaaS node runtime: lease tasks, run workflows, push trajectories, refresh weights.

The node owns the loop; a rollout backend only wraps an engine. Everything is pull:
the node calls the data layer, never the other way round, so a node can join from
anywhere with one URL and leave at any time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.components import build_workflow, role_map
from astraflow.contracts import RolloutBackend
from astraflow.lifecycle import launcher_gone, mark_ready
from astraflow.raas.engines import EnginePolicy, ServedPolicy, sampling_defaults, start_engines
from astraflow.raas.settings import NodeSettings, settings_from_config
from astraflow.raas.submitter import Submitter
from astraflow.weights.base import BaseMismatchError
from astraflow.workflows.builder import with_defaults
from astraflow.workflows.groups import GroupConfig, Overprovision, planned

log = logging.getLogger("astraflow.raas")
#: tasks in flight beyond rate x turnaround, for bursts and turnaround jitter
HEADROOM = 1.5
#: tasks in flight before the trainers' rate and the node's turnaround are measured
START_IN_FLIGHT = 16
#: weight of the newest turnaround in its moving average
TURNAROUND_WEIGHT = 0.1
#: longest a node waits before asking for tasks again, with none in flight / some: it
#: asks at once when a rollout finishes or a newer version loads, and these bound the
#: wait for what it cannot see (a lease expiring, a task source refilling)
IDLE_POLL = 0.2
BUSY_POLL = 0.5
#: longest a leaving node tries to tell the data layer so
LEAVE_TIMEOUT = 5.0
#: how often a leaving node waiting on its rollouts asks whether its data layer is gone
GONE_POLL = 0.5
#: a node whose last this many rollouts all failed, none for this many seconds (an
#: engine that died under it), stops with the last error, so that its launcher starts it
#: again (within launcher.max_restarts) instead of it failing every lease for ever
FAILED_IN_A_ROW = 16
FAILING_SECONDS = 30.0
#: a node that fails to load a version this many times in a row the same way (names or
#: shapes that do not fit its model) stops with the error instead of retrying in silence
LOAD_FAILURES = 3


class WeightsLoadError(RuntimeError):
    """A published version this node's engine refused to load (the engine's reason)."""


@dataclass
class NodeOptions:
    pool: str = "default"
    region: str = "local"
    #: most tasks in flight (memory and engine limits); how many the node keeps in
    #: flight below that follows the work: rate x turnaround (Little's law)
    concurrency: int = 64
    #: fewest seconds between two weight loads (versions published faster than that are
    #: skipped to the newest) and between checks for a first version. Short: every
    #: version the node is behind takes a batch from what admission control lets it
    #: have in flight (max_staleness bounds the sum)
    refresh_interval: float = 0.02
    #: seconds between retries of a refresh that failed (the data layer restarting)
    retry_interval: float = 0.5
    #: seconds a leaving node spends finishing and submitting what it leased; what is
    #: still running then is dropped (its leases expire and the tasks are issued again)
    leave_grace: float = 20.0
    #: longest a long-poll for newer weights is held open; each one that ends without
    #: news is followed by one plan request per policy (the store is the truth)
    refresh_wait: float = 10.0
    #: seconds between heartbeats until the data layer advises an interval (it does
    #: when the node registers, and grows it with the pool)
    heartbeat_interval: float = 2.0
    #: the synchronous baseline: run this many tasks per iteration, then wait for every
    #: policy's next version before leasing again (0: fully asynchronous)
    sync_tasks: int = 0
    #: fraction of its full rollout throughput this node delivers (1.0: all of it); a
    #: rollout taking t seconds holds its slot t / throttle, so CPU runs can model
    #: slower pools
    throttle: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.throttle <= 1:
            raise ValueError(f"throttle={self.throttle}: expected a fraction in (0, 1]")


class RaaSNode:
    def __init__(self, cfg: Any, url: str, token: str, work_dir: str,
                 options: NodeOptions | None = None, node_name: str | None = None) -> None:
        """``cfg``: the node's settings, or the run config they are read from."""
        from astraflow.dataflow.client import AsyncDataflowClient
        from astraflow.weights.client import WeightClient

        self.settings = (cfg if isinstance(cfg, NodeSettings)
                         else settings_from_config(cfg))
        self.options = options or NodeOptions()
        self.name = node_name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.client = AsyncDataflowClient(url, token)
        self.submitter = Submitter(self.client)
        # one weights directory per node: nodes sharing a work dir must not resume each
        # other's partial downloads or prune the version another node's engine is loading
        # on the data layer's machine, files come from its store's directory (no HTTP)
        self.weights = WeightClient(url, token, os.path.join(
            work_dir, "weights", self.name.replace(os.sep, "_")), local_reads=True)
        #: policy -> how this node serves it (several may share one engine)
        self.backends: dict[str, ServedPolicy] = {}
        self.engines: list[RolloutBackend] = []
        #: a set-up mistake found while refreshing (an adapter of another base): the
        #: node stops with it instead of retrying forever
        self.fatal: Exception | None = None
        #: found leaving: nothing listens at the data layer's address (it ended with a
        #: killed launcher), so rollouts in flight and the leave call are given up at once
        self.orphaned = False
        self.node_id: str | None = None
        self.completed = 0
        #: rollouts failed since the last that did not, and when that one ended
        self.failed_in_a_row = 0
        self.last_success = time.monotonic()
        #: tasks being rolled out now, and the moving average of lease-to-submit seconds
        self.in_flight = 0
        self.turnaround: float | None = None
        self._refresh_lock = asyncio.Lock()
        #: set when a newer version loads: the one change on this side that lets
        #: admission control issue more (each version a node catches up is one more batch
        #: its samples may wait for), so a refused node asks again at once
        self._loaded = asyncio.Event()
        #: one line per weight load: its version, seconds after its publication, seconds
        #: the load took
        self.refresh_log = Path(work_dir) / "metrics" / (
            "refresh-" + self.name.replace(os.sep, "_") + ".jsonl")

    async def start(self) -> None:
        from astraflow.text import load_tokenizer

        s = self.settings
        self.tokenizer = load_tokenizer(s.model_path).configure(s.task)
        self.workflow = build_workflow(s, self.tokenizer)
        self.groups = Overprovision(with_defaults(s.workflow.get("group") or {},
                                                  GroupConfig))
        self.roles = role_map(s, self.workflow.roles)
        self.backends = await start_engines(s, s.policies, self.engines)
        # made once (read from the config for every task, they cost it tens of us)
        defaults = sampling_defaults(s.workflow)
        self._handles = {role: EnginePolicy(policy, self.backends[policy], defaults)
                         for role, policy in self.roles.items()}
        # a node that joins late catches up before it serves
        await self.refresh(wait_for_first=True)
        await self._register()
        mark_ready()

    async def _register(self) -> None:
        self.node_id = await self.client.register(
            "raas", pool=self.options.pool, region=self.options.region,
            policies=self.settings.policies, capacity=self.options.concurrency,
            node_id=f"raas-{self.name}",
        )
        log.info("node %s registered as %s", self.name, self.node_id)

    async def refresh(self, wait_for_first: bool = False) -> bool:
        """Load every policy's newest weights that this node does not have yet; True if
        anything was loaded."""
        loaded = False
        async with self._refresh_lock:
            for policy, backend in self.backends.items():
                while wait_for_first and await asyncio.to_thread(self.weights.latest,
                                                                 policy) is None:
                    await asyncio.sleep(self.options.refresh_interval)
                # one request when nothing is new; a chain of deltas downloads at once
                synced = await asyncio.to_thread(self.weights.newer, policy, backend.version)
                if synced is None:
                    continue
                version, path = synced
                started = time.time()
                try:
                    await backend.load(path, version,
                                       partial=self.settings.partial_rollouts)
                except BaseMismatchError:
                    raise
                except (ValueError, KeyError, RuntimeError) as exc:
                    raise WeightsLoadError(f"node {self.name}: {policy} version {version} "
                                           f"does not load: {exc}") from exc
                self._refreshed(policy, version, path, time.time() - started,
                                backend.drained)
                loaded = True
        if loaded:
            self._loaded.set()
        return loaded

    def _refreshed(self, policy: str, version: int, path: Path, load_seconds: float,
                   drained: float | None = None) -> None:
        """A version now serves: how long after its publication, and how long the load
        took (with the engine paused, that includes waiting for the generations in flight
        to finish: ``drain_seconds`` of it). One JSON line per load in
        ``metrics/refresh-<node>.jsonl``."""
        from astraflow.weights.store import MANIFEST

        created = json.loads((path / MANIFEST).read_text()).get("created")
        record = {"kind": "refresh", "time": time.time(), "node": self.name,
                  "policy": policy, "version": version,
                  "load_seconds": round(load_seconds, 4),
                  "since_published": round(time.time() - created, 4) if created else None}
        if drained is not None:
            record["drain_seconds"] = round(drained, 4)
        self.refresh_log.parent.mkdir(parents=True, exist_ok=True)
        with self.refresh_log.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        log.info("node %s: %s now at version %d (%.2f s after its publication; load %.2f s)",
                 self.name, policy, version, record["since_published"] or 0.0, load_seconds)

    def policy_handles(self) -> dict[str, EnginePolicy]:
        """The workflow's handle of each of its roles (made at start)."""
        return dict(self._handles)

    def target_in_flight(self) -> int:
        """Tasks to keep in flight: enough to sustain this node's share of what the
        trainers consume over its turnaround (Little's law: L = rate x time), with
        headroom, and never more than ``concurrency``."""
        return in_flight_target(self.client.pace.get("tasks_per_second"),
                                self.turnaround or self.client.pace.get("turnaround_seconds"),
                                self.options.concurrency)

    async def _run_lease(self, lease: Any, more: bool = False) -> list[Any]:
        """Roll the lease's task out and submit it; with ``more``, the submission also
        leases the task that takes its slot (returned), saving a round trip, unless the
        node keeps fewer in flight now."""
        self.in_flight += 1
        try:
            return await self._roll_out(lease, more)
        finally:
            self.in_flight -= 1

    async def _roll_out(self, lease: Any, more: bool) -> list[Any]:
        task = lease.task
        task.metadata["group_id"] = lease.lease_id
        started = time.time()
        plan = self.groups.plan(lease.group_size, self.turnaround)
        with planned(plan):
            trajectories = await self.workflow.run(task, self.policy_handles(),
                                                   lease.group_size)
        self.groups.observe(plan)
        group = plan.metadata()
        if self.options.throttle < 1:
            await asyncio.sleep((time.time() - started) * (1 / self.options.throttle - 1))
        for traj in trajectories:
            traj.policy = self.roles.get(traj.policy, traj.policy)
            traj.metadata.update(node=self.name, pool=self.options.pool,
                                 region=self.options.region, started_at=started,
                                 finished_at=time.time(), **group)
        versions = {p: b.version for p, b in self.backends.items()}
        more = more and self.in_flight <= self.target_in_flight()
        out = await self.submitter.submit(lease, trajectories, lease_more=int(more),
                                          versions=versions)
        seconds = time.time() - started
        self.turnaround = seconds if self.turnaround is None else (
            self.turnaround + TURNAROUND_WEIGHT * (seconds - self.turnaround))
        self.completed += 1
        return out.get("leases", [])

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        """Beat at the interval the data layer advises, skipping a beat when a lease or
        a submission reached it within the interval (it counts as one): ten thousand
        busy nodes send none."""
        while not stop.is_set():
            interval = self.client.heartbeat_interval or self.options.heartbeat_interval
            quiet = time.monotonic() - self.client.heard_at
            if quiet >= interval:
                await self.client.heartbeat(self.node_id)
                quiet = 0.0
            await _wait(stop, interval - quiet)

    async def _refreshes(self, stop: asyncio.Event) -> None:
        """Refresh whenever the data layer announces a newer version (a long-poll), and
        once after every long-poll that ends without one.

        After a load it waits ``refresh_interval`` first: when versions come faster than
        that, the engine pauses at most once per interval and loads the newest.

        The long-poll waits for versions newer than the newest this node has *seen*
        announced, not the one it holds: a version announced before its weights are
        downloadable is retried at the next timeout instead of waking the node at once
        again and again.
        """
        seen = {p: b.version for p, b in self.backends.items()}
        failure, failures = "", 0  # the last load failure, and how often in a row
        while not stop.is_set():
            try:
                if await self.refresh():
                    failure, failures = "", 0
                    await _wait(stop, self.options.refresh_interval)
                have = {p: max(seen[p], b.version) for p, b in self.backends.items()}
                latest = await self.client.wait_versions(have, self.options.refresh_wait)
                seen = {p: max(have[p], latest.get(p, 0)) for p in have}
            except BaseMismatchError as exc:  # retrying cannot mend it: the node stops
                self.fatal = exc
                stop.set()
                return
            except WeightsLoadError as exc:  # a file fetched again may load; the same
                failures = failures + 1 if str(exc) == failure else 1
                failure = str(exc)
                log.error("%s (attempt %d of %d)", exc, failures, LOAD_FAILURES)
                if failures >= LOAD_FAILURES:  # refusal each time will not
                    self.fatal = exc
                    stop.set()
                    return
                await _wait(stop, self.options.retry_interval)
            except Exception as exc:  # the data layer restarting: keep the weights we have
                log.warning("node %s: weight refresh failed, retrying: %r", self.name, exc)
                await _wait(stop, self.options.retry_interval)

    async def _lease(self, max_tasks: int, versions: dict[str, int], wait: float = 0.0
                     ) -> list[Any]:
        """Leases; a node the data layer retired meanwhile (a restart, a long pause)
        registers again instead of dying."""
        from astraflow.dataflow.client import DataflowError

        try:
            return await self.client.lease_tasks(self.node_id, max_tasks=max_tasks,
                                                 wait=wait, versions=versions)
        except DataflowError as exc:
            if exc.status != 404:
                raise
            log.warning("node %s was retired by the data layer; registering again", self.name)
            await self._register()
            return []

    async def _async_loop(self, stop: asyncio.Event) -> None:
        running: set[asyncio.Task] = set()
        while not stop.is_set():
            self._loaded.clear()  # a version loaded from here on is in the next request
            free = max(0, self.target_in_flight() - len(running))
            versions = {p: b.version for p, b in self.backends.items()}
            leases = await self._lease(free, versions) if free else []
            for lease in leases:
                running.add(asyncio.create_task(self._run_lease(lease, more=True)))
            # until a rollout finishes (its submission leases the next) or a newer version
            # loads (admission may issue more): a node refused for staleness with nothing
            # in flight asks again as soon as it refreshes, not after a guessed pause
            wakers: set[asyncio.Task[Any]] = {asyncio.ensure_future(self._loaded.wait()),
                                              asyncio.ensure_future(stop.wait())}
            # a data layer shedding load says when to ask again: thousands of idle nodes
            # polling every IDLE_POLL would be the overload
            idle = max(IDLE_POLL, self.client.overloaded_retry or 0.0)
            try:
                done, running = await asyncio.wait(
                    running | wakers, timeout=BUSY_POLL if running else idle,
                    return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waker in wakers:
                    waker.cancel()
            running -= wakers
            done -= wakers
            self._report(done, stop)
            for finished in done:  # the leases that came back with the submissions
                if finished.exception() is None:
                    for lease in finished.result():
                        running.add(asyncio.create_task(
                            self._run_lease(lease, more=not stop.is_set())))
        # a node whose launcher died: the data layer got its SIGTERM too (and may hold
        # a request unanswered while it stops), so nothing is handed in or said to it
        self.orphaned = self.orphaned or launcher_gone()
        if running:  # a leaving node finishes what it leased, for a while
            # unless the run is over: with every trainer gone nothing would train on them
            over = not self.orphaned and await self._trainers_gone()
            grace = 0.0 if over or self.orphaned else self.options.leave_grace
            done, late = await self._finish(running, grace) if grace else (set(), running)
            self._report(done, stop)
            for task in late:  # e.g. submissions retrying a data layer that is gone:
                task.cancel()  # their leases expire and are issued again
            if late and over:
                log.info("node %s: every trainer is gone; dropped %d rollouts in flight",
                         self.name, len(late))
            elif late and self.orphaned:
                log.warning("node %s: the data layer is gone; dropped %d rollouts in flight "
                            "(their tasks will be issued again)", self.name, len(late))
            elif late:
                log.warning("node %s: left %d rollouts unfinished after %.0fs; their tasks "
                            "will be issued again", self.name, len(late), grace)
            if late:
                await asyncio.wait(late)

    async def _finish(self, running: set[asyncio.Task], grace: float
                      ) -> tuple[set[asyncio.Task], set[asyncio.Task]]:
        """Wait up to ``grace`` for the rollouts in flight, unless the data layer goes
        meanwhile (a killed launcher: every component gets SIGTERM at once, and the data
        layer may still answer the first moment): nothing could take them then, and their
        tasks are in its store, to be issued again. Returns (done, late)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        done: set[asyncio.Task] = set()
        while running and (left := deadline - loop.time()) > 0:
            finished, running = await asyncio.wait(running, timeout=min(left, GONE_POLL))
            done |= finished
            if running and await self.client.gone():
                self.orphaned = True
                break
        return done, running

    def _report(self, done: set[asyncio.Task], stop: asyncio.Event) -> None:
        """Logs each failed rollout; a node whose rollouts have all failed for a while
        stops with the last error (see :data:`FAILED_IN_A_ROW`)."""
        for task in done:
            error = task.exception()
            if error is None:
                self.failed_in_a_row, self.last_success = 0, time.monotonic()
                continue
            log.error("rollout failed: %r", error)
            self.failed_in_a_row += 1
            failing = time.monotonic() - self.last_success
            if (self.fatal is None and self.failed_in_a_row >= FAILED_IN_A_ROW
                    and failing >= FAILING_SECONDS):
                self.fatal = RuntimeError(
                    f"node {self.name}: its last {self.failed_in_a_row} rollouts failed and "
                    f"none succeeded for {failing:.0f} s; it stops so that it can be started "
                    f"again. The last error: {error!r}")
                stop.set()

    async def _trainers_gone(self) -> bool:
        """Whether every policy this node serves has lost all its trainers (they left at
        the end of the run); False when the data layer does not answer at once."""
        try:
            status = await asyncio.wait_for(self.client.status(), timeout=2.0)
            policies = status["policies"]
            return all(policies[p].get("trainer_gone") for p in self.backends)
        except Exception:
            return False

    async def _sync_loop(self, stop: asyncio.Event) -> None:
        """The trainer-centred baseline: generate an iteration with the current weights,
        wait for its slowest rollout, then for every trainer's update, then refresh.

        Leasing is bounded by the data layer's admission control (max_staleness 0 in
        this mode), so a round that fell short (filtered or dropped samples) is topped
        up by the next lease instead of over-producing. Policies whose trainer already
        stepped this iteration are left out of the versions the lease reports: a policy
        that gets fewer samples per task than another (a verifier trained only on some
        groups) still has its batch filled, the others' extra samples are dropped as
        stale -- the barrier's cost -- where reporting them would stop all leasing.
        """
        while not stop.is_set():
            versions = {p: b.version for p, b in self.backends.items()}
            waiting = dict(versions)
            while not stop.is_set():
                leases = await self.client.lease_tasks(
                    self.node_id, max_tasks=self.options.sync_tasks, wait=0.5,
                    versions=waiting)
                if leases:
                    self._report((await asyncio.wait(
                        [asyncio.create_task(self._run_lease(lease)) for lease in leases]))[0],
                        stop)
                latest = {p: await asyncio.to_thread(self.weights.latest, p)
                          for p in self.backends}
                waiting = {p: v for p, v in versions.items() if (latest[p] or 0) <= v}
                if not waiting:
                    await self.refresh()
                    break
                if not leases:
                    await _wait(stop, 0.1)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.start()
        sync = self.options.sync_tasks > 0
        side = [asyncio.create_task(self._heartbeats(stop))]
        if not sync:
            side.append(asyncio.create_task(self._refreshes(stop)))
        try:
            await (self._sync_loop(stop) if sync else self._async_loop(stop))
        finally:
            for t in side:
                t.cancel()
            if self.node_id is not None and not self.orphaned:
                try:
                    # not the client's minutes of retries: a node stopped because its
                    # launcher died finds the data layer gone too, and must still end
                    await asyncio.wait_for(self.client.leave(self.node_id), LEAVE_TIMEOUT)
                except Exception as exc:  # leaving is best-effort: leases expire anyway
                    log.warning("leave failed: %r", exc)
            await self.submitter.aclose()
            workflow = getattr(self, "workflow", None)
            if workflow is not None:
                await workflow.aclose()
            for engine in self.engines:
                await engine.shutdown()
            log.info("node %s left after %d rollouts, submitted in %d requests", self.name,
                     self.completed, self.submitter.requests)
            groups = getattr(self, "groups", None)
            if groups is not None:
                log.info("node %s: over-provisioned groups started %d samples and cancelled "
                         "%d of them (never trained); %s", self.name, groups.started,
                         groups.cancelled, groups.why(self.turnaround))
        if self.fatal is not None:
            raise self.fatal


def in_flight_target(rate: float | None, turnaround: float | None, cap: int) -> int:
    """Little's law with headroom: ``rate`` tasks/s for ``turnaround`` s each, at most
    ``cap``. While either is unknown, ``START_IN_FLIGHT``: a node does not flood a slow
    workload (agents with timeouts) before it has measured it."""
    if not rate or not turnaround:
        return min(cap, START_IN_FLIGHT)
    return max(1, min(cap, math.ceil(rate * turnaround * HEADROOM) + 1))


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
