"""The local launcher: data layer, RaaS nodes, one trainer and one evaluator per policy,
each a subprocess of ``python -m astraflow``; live progress; a run directory.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from omegaconf import DictConfig

from astraflow.components import policy_names
from astraflow.errors import ConfigError
from astraflow.launch import preload, stopping
from astraflow.launch.oom import MemoryWatch, reap
from astraflow.launch.preload import ForkedProcess
from astraflow.launch.prepare import prepare_run
from astraflow.launch.report import write_report
from astraflow.lifecycle import READY_ENV
from astraflow.loggers.base import Loggers
from astraflow.security import TOKEN_ENV, resolve_token

#: seconds an interrupted or failed run's stop may take before what is left is killed
#: (two stops of 20 s, each then SIGKILL and 10 s, plus the loggers' last flush)
STOP_BOUND = 90.0
#: lines of nanobind's report of leaked objects, printed as an interpreter exits
EXIT_NOISE = re.compile(r"nanobind: |See https://nanobind\.| - leaked | - \.\.\. skipped ")


def _local(child: Child) -> bool:
    """A process of this machine that the launcher started (not a Ray actor's, whose pid
    is another machine's or none yet)."""
    return isinstance(child.proc, subprocess.Popen | ForkedProcess) and bool(child.proc.pid)


@dataclass
class Child:
    name: str
    args: tuple[str, ...]
    proc: subprocess.Popen[bytes] | ForkedProcess
    log: Path
    restarts: int = 0
    #: when each restart was (the restart window counts those still inside it)
    restarted_at: list[float] = field(default_factory=list)
    #: stopped on purpose (a retired node): its exit is not a fault
    retired: bool = False

    def finished(self) -> bool:
        """A trainer or evaluator that exited 0 is done; nothing else ends on its own."""
        return self.proc.returncode == 0 and self.name.startswith(("trainer-", "eval-"))

    @property
    def ready_file(self) -> Path:
        return self.log.with_suffix(".ready")

    def worked(self) -> bool:
        """Whether this component ever got to work (see :func:`mark_ready`): one that
        dies before is failing on its set-up, and restarting it would fail the same way."""
        return self.ready_file.exists()

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` of the component's log that say something: the report of
        objects a compiled extension leaked, which an interpreter importing torch prints
        as it exits (nanobind's, for triton), would hide the error above it."""
        try:
            text = self.log.read_text(errors="replace").rstrip().splitlines()
        except OSError:
            return ""
        said = [line for line in text if not EXIT_NOISE.match(line)]
        return "\n".join(f"  | {line}" for line in said[-lines:])


@dataclass
class LocalRun:
    cfg: DictConfig
    run_dir: Path
    token: str
    children: dict[str, Child] = field(default_factory=dict)
    url: str = ""
    _http: httpx.Client | None = None
    #: the data layer's listening socket, bound by the launcher (see start_dataflow)
    _listener: socket.socket | None = None
    #: the parent components are forked from (``launcher.preload``), if any
    preloader: preload.Preloader | None = None
    #: each component's peak memory, and the count of the kernel's OOM kills
    memory: MemoryWatch = field(default_factory=MemoryWatch)
    #: an evaluator per policy is started; not when the task has no held-out split
    #: (it would hold a copy of the model for nothing)
    evaluated: bool = True

    def get(self, route: str) -> dict[str, Any]:
        """``GET route`` of the data layer as JSON ({} when it does not answer), on one
        kept client: a client per call built a TLS context each time, 0.1 s of CPU
        taken from the run twice a second."""
        if self._http is None:
            self._http = httpx.Client(timeout=2.0,
                                      headers={"Authorization": f"Bearer {self.token}"})
        try:
            resp = self._http.get(f"{self.url}{route}")
            return resp.json() if resp.status_code == 200 else {}
        except httpx.HTTPError:
            return {}

    def env(self, ready: Path) -> dict[str, str]:
        """The environment of a component: its preloaded parent's, the run's token, and
        where it marks that it got to work."""
        return {**preload.parent_env(), TOKEN_ENV: self.token, READY_ENV: str(ready)}

    def spawn(self, name: str, *args: str, pass_fds: tuple[int, ...] = ()) -> Child:
        log = self.run_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = self.env(log.with_suffix(".ready"))
        proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        if self.preloader is not None and not pass_fds:
            proc = self.preloader.fork(list(args), env, log)
        if proc is None:
            with log.open("ab") as fh:
                proc = subprocess.Popen([sys.executable, "-m", "astraflow", *args], stdout=fh,
                                        stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True, pass_fds=pass_fds)
        previous = self.children.get(name)
        self.memory.started(name)
        child = Child(name, args, proc, log, previous.restarts if previous else 0,
                      previous.restarted_at if previous else [])
        self.children[name] = child
        self.event(event="start", component=name, pid=proc.pid,
                   forked=isinstance(proc, ForkedProcess))
        return child

    def start_preloader(self) -> None:
        """With ``launcher.preload``: the parent that components are forked from, started
        importing now (see :mod:`astraflow.launch.preload`)."""
        if not self.cfg.launcher.get("preload", False):  # launcher=ray has none
            if self.preloader is not None:  # started early, before the config said no
                self.preloader.close()
                self.preloader = None
            return
        why = preload.available()
        if why is not None:
            print(f"astraflow: starting components without the preloaded parent: {why}",
                  file=sys.stderr)
            return
        modules = (preload.modules_for(self.cfg) + preload.model_modules(self.cfg.model.path)
                   + list(self.cfg.launcher.get("preload_modules") or []))
        log = self.run_dir / "logs" / "preload.log"
        if self.preloader is None:
            self.preloader = preload.Preloader(log, preload.parent_env(), modules)
        else:
            self.preloader.move_log(log)
            self.preloader.preload(modules)

    def start_dataflow(self) -> None:
        """Start the data layer on a socket the launcher bound and keeps: the URL is
        known at once, so the components start (and import torch) while the data layer
        starts, and a restart serves the same address, where the requests made meanwhile
        wait. :meth:`wait_dataflow` waits until it listens."""
        from astraflow.dataflow import listen

        (self.run_dir / "store" / "url").unlink(missing_ok=True)
        host = self.cfg.dataflow.host
        if self._listener is None:
            self._listener = self.bind_dataflow(self.cfg)
        listener = self._listener
        assert listener is not None  # this launcher's bind_dataflow always binds
        if not self.url:
            self.url = listen.url(host, listener)
        fd = listener.fileno()
        self.spawn("dataflow", "dataflow", "--fd", str(fd), "--host", host,
                   "--store", str(self.run_dir / "store"),
                   "--config", str(self.run_dir / "config.yaml"), pass_fds=(fd,))

    @staticmethod
    def bind_dataflow(cfg: DictConfig) -> socket.socket | None:
        """The data layer's listening socket, bound before anything starts: a port in
        use is a set-up mistake, said in one line."""
        from astraflow.dataflow import listen

        host, port = cfg.dataflow.host, int(cfg.dataflow.port)
        try:
            return listen.bind(host, port)
        except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
            raise ConfigError(f"dataflow.host={host} dataflow.port={port}: cannot listen "
                              f"there ({getattr(exc, 'strerror', None) or exc})") from None

    def wait_dataflow(self) -> None:
        """Until the data layer listens (it wrote its URL); an error if it exited."""
        child = self.children["dataflow"]
        url_file = self.run_dir / "store" / "url"
        deadline = time.time() + 120
        while not url_file.exists():
            if child.proc.poll() is not None:
                raise RuntimeError(f"the data layer exited with {child.proc.returncode} before "
                                   f"it listened; the end of {child.log}:\n{child.log_tail()}")
            if time.time() > deadline:
                raise TimeoutError(f"the data layer did not start; see {child.log}")
            time.sleep(0.05)
        child.ready_file.touch()
        self.announce_url()

    def announce_url(self) -> None:
        """Where nodes from other machines join (``astraflow raas --connect URL``): in
        ``<run_dir>/url``, and said once on the console."""
        first = not (self.run_dir / "url").exists()
        (self.run_dir / "url").write_text(self.url + "\n")
        if first:
            print(f"astraflow: data layer at {self.url}", file=sys.stderr)
            # the token goes in the link's fragment, which no server or log ever sees;
            # a token the user set is theirs to type
            login = (" (log in with $" + TOKEN_ENV + ")" if os.environ.get(TOKEN_ENV)
                     else f"#token={self.token}")
            print(f"astraflow: dashboard at {self.url}/dashboard{login}", file=sys.stderr)

    def collect(self) -> None:
        """Bring what components wrote elsewhere into the run directory (here they
        write in it)."""

    def component_args(self) -> list[str]:
        return ["--connect", self.url, "--config", str(self.run_dir / "config.yaml"),
                "--work-dir", str(self.run_dir)]

    def start_components(self) -> None:
        metrics = self.run_dir / "metrics"
        for policy in policy_names(self.cfg):
            self.spawn(f"trainer-{policy}", "train", *self.component_args(), "--policy", policy,
                       "--metrics", str(metrics / f"train-{policy}.jsonl"))
            if self.evaluated:
                self.spawn(f"eval-{policy}", "eval", *self.component_args(), "--policy",
                           policy, "--metrics", str(metrics / f"eval-{policy}.jsonl"))
        self.start_nodes()

    def start_nodes(self) -> None:
        for i in range(self.cfg.num_nodes):
            self.start_node(i)

    def sync_args(self, nodes: int) -> list[str]:
        """mode=sync: each node's share of an iteration's tasks, over ``nodes`` nodes."""
        if self.cfg.mode != "sync":
            return []
        per_iteration = math.ceil(self.cfg.batch_size / self.cfg.group_size)
        return ["--sync-tasks", str(math.ceil(per_iteration / nodes))]

    def start_node(self, index: int) -> Child:
        extra = self.sync_args(self.cfg.num_nodes)
        throttles = list(self.cfg.launcher.get("node_throttle") or [1.0])  # launcher=ray: none
        return self.spawn(f"raas-{index}", "raas", *self.component_args(),
                          "--name", f"node-{index}", "--concurrency",
                          str(self.cfg.node_concurrency),
                          "--throttle", str(throttles[index % len(throttles)]), *extra)

    def status(self) -> dict[str, Any]:
        return self.get("/v1/status")

    def event(self, **record: Any) -> None:
        """A launcher event in the run's metric streams (and so in metrics.jsonl)."""
        path = self.run_dir / "metrics" / "launcher.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(json.dumps({"kind": "launcher", "time": time.time(), **record}) + "\n")

    def supervise(self) -> None:
        """Restart every component that died unexpectedly, up to ``launcher.max_restarts``
        times each; beyond that the run fails, naming the component and its log."""
        limit = int(self.cfg.launcher.max_restarts)
        window = float(self.cfg.launcher.restart_window)
        if self.preloader is not None:  # a subreaper adopts orphans it must reap
            preload.reap_orphans({c.proc.pid for c in self.children.values()}
                                 | self.preloader.known())
        memory = self.memory
        memory.tick()
        for child in list(self.children.values()):
            code, peak = reap(child.proc)
            if code is None:
                memory.sample(child.name, child.proc.pid)
                continue
            memory.exited(child.name, peak)
            if child.retired or child.finished():
                continue
            death = memory.death(child.name, code, memory.peaks.get(child.name, 0))
            if death is not None:  # restarted, it would grow into the same death
                self.event(event="oom_kill", component=child.name, exit_code=code,
                           verdict=death.verdict, peak_bytes=death.peak,
                           limit_bytes=death.limit, evidence=death.evidence)
                raise RuntimeError(death.said(child.name, child.log))
            if not child.worked():
                raise RuntimeError(f"{child.name} exited with {code} before it started "
                                   f"working, so it is not restarted; the end of {child.log}:"
                                   f"\n{child.log_tail()}")
            now = time.monotonic()
            child.restarted_at[:] = [t for t in child.restarted_at if now - t < window]
            if len(child.restarted_at) >= limit:
                raise RuntimeError(f"{child.name} exited with {code} after {child.restarts} "
                                   f"restarts (launcher.max_restarts={limit} in "
                                   f"launcher.restart_window={window:g} s); the end of "
                                   f"{child.log}:\n{child.log_tail()}")
            child.restarts += 1
            child.restarted_at.append(now)
            print(f"astraflow: {child.name} exited with {code}; restarting it "
                  f"({len(child.restarted_at)} of {limit} within {window:g} s)",
                  file=sys.stderr)
            self.event(event="restart", component=child.name, exit_code=code,
                       restart=child.restarts, peak_bytes=memory.peaks.get(child.name, 0))
            if child.name == "dataflow":
                self.start_dataflow()
                self.wait_dataflow()
            else:
                self.spawn(child.name, *child.args)

    def nodes(self, pool: str = "default") -> list[Child]:
        """Local nodes in service, in start order (one pool here: ``default``)."""
        return sorted((c for c in self.children.values()
                       if c.name.startswith("raas-") and not c.retired),
                      key=lambda c: int(c.name.removeprefix("raas-")))

    def add_node(self, pool: str = "default") -> Child:
        """One more node, numbered after every node started so far."""
        return self.start_node(max((int(c.removeprefix("raas-")) for c in self.children
                                    if c.startswith("raas-")), default=-1) + 1)

    def autoscalers(self) -> list[Autoscaler]:
        return [Autoscaler(self)]

    def scaled(self, pool: str) -> None:
        """After the autoscaler changed a pool (a cluster launcher asks for room)."""

    def retire(self, child: Child) -> None:
        """SIGTERM: the node finishes its leases and leaves; it is not restarted."""
        child.retired = True
        child.proc.terminate()

    def stop(self, names: list[str] | None = None, timeout: float = 20.0) -> None:
        chosen = [self.children[n] for n in (names or list(self.children)) if n in self.children]
        for child in chosen:
            if child.proc.poll() is None:
                child.proc.terminate()
        deadline = time.time() + timeout
        for child in chosen:
            try:
                child.proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                if _local(child):  # its process group: the engine's helpers go with it
                    stopping.kill_groups([child.proc.pid])
                else:  # an actor of Ray's: killed through Ray
                    child.proc.kill()
                try:  # bounded: a process in uninterruptible I/O takes SIGKILL late
                    child.proc.wait(10.0)
                except subprocess.TimeoutExpired:
                    print(f"astraflow: {child.name} (pid {child.proc.pid}, state "
                          f"{stopping.process_state(child.proc.pid)}) has not ended 10 s "
                          "after SIGKILL", file=sys.stderr)
        if names is None and self.preloader is not None:
            self.preloader.close()
            self.preloader = None
        if names is None and self.memory.highest:  # what each component took at its peak
            self.event(event="peak_memory", peaks=dict(self.memory.highest))

    def running(self) -> dict[str, int]:
        """Name -> pid of each process the launcher started that it has not seen end."""
        pids = {c.name: c.proc.pid for c in self.children.values()
                if _local(c) and c.proc.returncode is None}
        if self.preloader is not None:
            pids["preloaded parent"] = self.preloader.proc.pid
        return pids


@dataclass
class Autoscaler:
    """Closes the loop on the data layer's dead-band report for the local pool.

    The report stays an HTTP resource (``/v1/autoscale``) for operators of other
    pools; this acts on the launcher's own nodes only, within ``min_nodes`` and
    ``max_nodes``, and at most once per ``launcher.autoscale_cooldown`` seconds because
    the report's window lags behind every change.
    """

    job: LocalRun
    pool: str = "default"
    next_check: float = 0.0
    last_change: float = 0.0

    def report(self) -> dict[str, Any]:
        return self.job.get("/v1/autoscale")

    def tick(self) -> None:
        cfg = self.job.cfg
        now = time.time()
        if now < self.next_check or now - self.last_change < cfg.launcher.autoscale_cooldown:
            return
        self.next_check = now + cfg.launcher.autoscale_interval
        advice = self.report().get("pools", {}).get(self.pool)
        if not advice or advice["action"] == "hold":
            return
        nodes = self.job.nodes(self.pool)
        target = max(cfg.min_nodes, min(cfg.max_nodes, advice["target"]))
        if target == len(nodes):
            return
        if target > len(nodes):
            for _ in range(target - len(nodes)):
                self.job.add_node(self.pool)
        else:
            for child in nodes[target:]:
                self.job.retire(child)
        self.last_change = now
        self.job.scaled(self.pool)
        print(f"astraflow: autoscale pool {self.pool}: {len(nodes)} -> {target} nodes "
              f"({advice['reason']})", file=sys.stderr)
        self.job.event(event="autoscale", pool=self.pool, nodes=len(nodes), target=target,
                       advised=advice["target"], reason=advice["reason"])


@dataclass
class RewardWatch:
    """Shows the first failure of the run's reward on the console (and in the metrics),
    and stops the run once failures pass ``reward.max_failure_fraction``: a reward that
    fails that often is a bug to fix, not noise to train through."""

    job: LocalRun
    #: samples of a policy scored before its failure fraction is judged
    min_samples: int = 50
    shown: set[str] = field(default_factory=set)

    def check(self, status: dict[str, Any]) -> None:
        limit = float(self.job.cfg.reward.get("max_failure_fraction", 1.0))
        for policy, info in status.get("policies", {}).items():
            failed, produced = info.get("reward_failed", 0), info.get("produced", 0)
            error = info.get("first_reward_error")
            what = ("the agent or its reward" if self.job.cfg.workflow.get("name") == "agent"
                    else "the reward")
            if error and policy not in self.shown:
                self.shown.add(policy)
                last = error.strip().splitlines()[-1]
                print(f"astraflow: warning: {what} failed on a {policy} sample (scored "
                      f"as failed, kept out of its group's advantages): {last}",
                      file=sys.stderr)
                self.job.event(event="reward_failure", policy=policy, error=error)
            if produced >= self.min_samples and failed > limit * produced:
                raise RuntimeError(
                    f"{what} failed on {failed} of {produced} {policy} samples "
                    f"({failed / produced:.0%} > reward.max_failure_fraction={limit}); "
                    f"the first failure:\n{error}")


def _supervise(job: LocalRun, progress: Any, loggers: Loggers) -> dict[str, Any]:
    """Watch the run until every trainer (and evaluator) is done: restart what failed,
    scale the nodes, show progress, feed the loggers; the data layer's last status."""
    cfg = job.cfg
    learners = [f"{kind}-{p}" for p in policy_names(cfg)
                for kind in (("trainer", "eval") if job.evaluated else ("trainer",))]
    autoscalers = job.autoscalers() if cfg.autoscale else []
    rewards = RewardWatch(job)
    with progress:
        while True:
            job.supervise()
            for autoscaler in autoscalers:
                autoscaler.tick()
            if all(job.children[n].finished() for n in learners):
                break
            status = job.status()
            rewards.check(status)
            progress.update(status)
            loggers.update()
            time.sleep(0.5)
        progress.update(job.status())
    return job.status()


def run(cfg: DictConfig, job_cls: type[LocalRun] = LocalRun,
        preloader: preload.Preloader | None = None) -> int:
    """Run the job with ``job_cls`` starting its components (``launcher=ray``: Ray's),
    forking them from ``preloader`` if one was started early (:func:`preload.start_early`)."""
    from astraflow.launch.progress import Progress

    started = time.time()
    listener = job_cls.bind_dataflow(cfg)
    cfg, run_dir, evaluated = prepare_run(cfg)
    job = job_cls(cfg, run_dir, resolve_token(), _listener=listener, preloader=preloader,
                  evaluated=evaluated)
    progress = Progress(cfg, run_dir, enabled=bool(cfg.launcher.progress))
    print(f"astraflow: run directory {run_dir}", file=sys.stderr)
    if not evaluated:
        print(f"astraflow: task={cfg.task.name} has no held-out split, so no evaluator is "
              "started" + (" (task.eval_files or task.eval_size give one)"
                           if "eval_size" in cfg.task else ""), file=sys.stderr)
    stopping.stop_on_sigterm()
    loggers = Loggers(cfg, run_dir)
    try:
        job.start_dataflow()
        job.start_preloader()
        job.start_components()
        job.wait_dataflow()
        # after the components started, not before: a logger's library may import torch
        # (tensorboardX does), seconds the launcher would keep them waiting
        loggers.open()
        final_status = _supervise(job, progress, loggers)
        job.collect()
    except KeyboardInterrupt:
        print("astraflow: interrupted; stopping every component", file=sys.stderr)
        # a second signal must not cut the stop short and leave components running;
        # the stop is bounded (each component gets SIGTERM, then SIGKILL)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        with stopping.StopDeadline(job.running, STOP_BOUND, code=130):
            # nodes first, as at a run's end: they hand in what they finished while the
            # data layer is there (stopped together, a node waited its leave grace for it)
            job.stop([n for n in job.children if n.startswith("raas-")])
            job.stop()
            loggers.close()
        return 130
    except (RuntimeError, TimeoutError) as exc:
        print(f"astraflow: error: {exc}", file=sys.stderr)
        with stopping.StopDeadline(job.running, STOP_BOUND, code=1):
            job.stop()
            loggers.close()
        return 1
    job.stop([n for n in job.children if n.startswith("raas-")])
    job.stop()
    loggers.close()
    summary = write_report(cfg, run_dir, final_status, time.time() - started, started)
    print(json.dumps(summary, indent=2))
    return 0
