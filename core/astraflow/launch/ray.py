"""``launcher=ray``: the local launcher's components, each a process owned by a Ray actor.

The data layer, one trainer and one evaluator per policy, and the RaaS nodes of every
pool in ``launcher.pools`` are started as actors with their resource requests
(``num_cpus``, ``num_gpus`` and custom resources that pin a pool to machines, e.g.
``{"region_eu": 1}``). Each actor runs the component's own command
(``python -m astraflow raas|train|eval|dataflow ...``) as its child process, on the
machine Ray placed it on, with the GPUs Ray gave it.

Restarts are Ray's: an actor whose component crashes after it got to work exits, and
Ray starts it again (``max_restarts``), which starts the component again; one that
fails during set-up is not restarted (it would fail the same way) and the run stops
naming it. When the launcher exits -- the run is over, Ctrl-C, a stopped Ray job --
its actors and their components go with it.

``launcher.address`` attaches to a running cluster (``auto``, ``ray://HOST:10001`` or
``HOST:PORT``); with none, a cluster is started on this machine for the run. The run
directory is the driver's alone: each component works in a directory of the machine it
runs on (:func:`work_root`), and the launcher copies what the run directory shows --
logs, metric streams, the final weights -- from there over Ray. No machine needs a
shared file system, but every machine reads ``model.path`` and the task's files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from astraflow.components import trainer_settings
from astraflow.errors import ConfigError
from astraflow.launch.local import Child, LocalRun
from astraflow.launch.ray_actor import WORK, RayProc, component_actor
from astraflow.launcher_options import PoolConfig
from astraflow.security import TOKEN_ENV

#: how long a copy of a file's new bytes may take before it waits for the next look
_POLL_SECONDS = 5.0
#: a component Ray has not placed after this many seconds is said to wait for room
_PLACEMENT_SECONDS = 10.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("launcher=ray needs Ray: pip install 'astraflow[ray]'") from None
    return ray


def work_root(run_dir: Path, configured: str | None) -> str:
    """Where components keep their files on the machines they run on: one directory per
    run (a restarted trainer finds its checkpoints there), ``{tmp}/astraflow/<run>``
    unless ``launcher.work_dir`` names storage that outlives a machine."""
    key = hashlib.sha1(f"{socket.gethostname()}:{run_dir}".encode()).hexdigest()[:8]
    return os.path.join(configured or os.path.join(tempfile.gettempdir(), "astraflow"),
                        f"{run_dir.name}-{key}")


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def pool_settings(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """``launcher.pools`` with every key filled in (:class:`PoolConfig`'s defaults; the
    config's check refused anything else); none: one pool "default" of ``num_nodes``
    nodes of one CPU each."""
    out = {}
    for name, given in (cfg.launcher.pools or {}).items():
        pool = {**dataclasses.asdict(PoolConfig()), **given}
        out[str(name)] = {"nodes": int(pool["nodes"]), "num_cpus": float(pool["num_cpus"]),
                          "num_gpus": float(pool["num_gpus"]),
                          "resources": dict(pool["resources"] or {})}
    if not out:
        out["default"] = {"nodes": int(cfg.num_nodes), "num_cpus": 1.0, "num_gpus": 0.0,
                          "resources": {}}
    return out


def connect(ray: Any, cfg: DictConfig) -> None:
    """Attach to ``launcher.address``, or start a cluster of this machine big enough for
    the run. A cluster that refuses this machine is a set-up mistake: one line."""
    if ray.is_initialized():
        return
    launcher = cfg.launcher
    address = launcher.address or None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "configure_logging": False}
    if address is None:  # a cluster of this machine, for this run
        pools = pool_settings(cfg)
        nodes = sum(p["num_cpus"] * p["nodes"] for p in pools.values())
        trainers = len(cfg.get("policies") or {"policy": None})
        kwargs["num_cpus"] = max(os.cpu_count() or 1, int(nodes + trainers + 1))
        kwargs["resources"] = dict(launcher.local_resources or {})
    try:
        ray.init(address=address, **kwargs)
    except ray.exceptions.AuthenticationError:
        raise ConfigError(_refused(address)) from None
    except ConnectionError as exc:
        raise ConfigError(f"launcher.address={address}: could not join the Ray cluster "
                          f"({exc}); a cluster with token authentication refuses a machine "
                          "without its token (RAY_AUTH_TOKEN_PATH)") from None


@dataclass
class RayRun(LocalRun):
    ray: Any = None
    actor_cls: Any = None
    #: pool name -> its settings (nodes, num_cpus, num_gpus, resources)
    pools: dict[str, Any] = field(default_factory=dict)
    #: (component, file in its working directory) -> bytes copied to the run directory
    copied: dict[tuple[str, str], int] = field(default_factory=dict)
    next_copy: float = 0.0
    #: the run ended well and everything was copied: working directories can go
    collected: bool = False
    #: components said to wait for placement; retired nodes whose actors were ended
    waiting: set[str] = field(default_factory=set)
    released: set[str] = field(default_factory=set)
    #: the Ray autoscaler was asked for room: withdrawn when the run ends
    requested: bool = False

    def __post_init__(self) -> None:
        self.ray = import_ray()
        self.pools = pool_settings(self.cfg)
        connect(self.ray, self.cfg)
        self.actor_cls = component_actor(self.ray)
        self.work = work_root(self.run_dir, self.cfg.launcher.work_dir)
        self.config_text = (self.run_dir / "config.yaml").read_text()

    def _placement(self, name: str) -> dict[str, Any]:
        launcher = self.cfg.launcher
        if name.startswith("raas-"):
            pool = self.pools[self.pool_of(name)]
            return {k: pool[k] for k in ("num_cpus", "num_gpus", "resources")}
        kind, _, policy = name.partition("-")  # dataflow | trainer | eval
        spec = launcher[{"eval": "evaluator"}.get(kind, kind)]
        gpus = float(spec.num_gpus)
        if kind == "trainer" and gpus:  # one GPU a rank, as many as this policy has
            gpus = float(trainer_settings(self.cfg, policy).get("world_size", 1) or 1)
        return {"num_cpus": float(spec.num_cpus), "num_gpus": gpus,
                "resources": dict(spec.resources or {})}

    @staticmethod
    def pool_of(name: str) -> str:
        return name.removeprefix("raas-").rsplit("-", 1)[0]

    # -- life cycle ---------------------------------------------------------------------
    def spawn(self, name: str, *args: str, pass_fds: tuple[int, ...] = ()) -> Child:
        """``name`` in an actor; ``pass_fds`` is the local launcher's (an actor gets no
        descriptor of the launcher's)."""
        log = self.run_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {TOKEN_ENV: self.token,
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        placement = self._placement(name)
        restarts = int(self.cfg.launcher.max_restarts)
        actor = self.actor_cls.options(
            name=None, max_restarts=restarts, max_task_retries=0,
            num_cpus=placement["num_cpus"], num_gpus=placement["num_gpus"],
            resources=placement["resources"] or None,
        ).remote(name, [self.remote_path(a) for a in args], env, self.work, self.config_text)
        previous = self.children.get(name)
        child = Child(name, args, RayProc(self.ray, actor), log,  # type: ignore[arg-type]
                      previous.restarts if previous else 0)
        self.children[name] = child
        return child

    def remote_path(self, arg: str) -> str:
        """A path in the run directory, as the component's working directory on its
        machine (whose files the launcher copies back)."""
        run = str(self.run_dir)
        if arg == run or arg.startswith(run + os.sep):
            return WORK + arg[len(run):]
        return arg

    # -- what comes back to the run directory -------------------------------------------
    def streams(self, child: Child) -> list[tuple[str, Path]]:
        """The files of a component that grow and are copied as they do: its log and
        its metric stream."""
        out = [(f"{child.name}.log", child.log)]
        args = list(child.args)
        if "--metrics" in args:
            local = Path(args[args.index("--metrics") + 1])
            out.append((str(local.relative_to(self.run_dir)), local))
            if child.name.startswith("trainer-") and self.cfg.get("record_batches"):
                local = local.with_name(f"batches-{child.name.removeprefix('trainer-')}.jsonl")
                out.append((str(local.relative_to(self.run_dir)), local))
        return out

    def copy(self, child: Child, remote: str, local: Path, offset: int = 0, *,
             whole_lines: bool = False, timeout: float = _POLL_SECONDS) -> int:
        """Append ``remote`` from ``offset`` to ``local``, chunk by chunk; the new offset.
        A file smaller than ``offset`` is a new one (the component was restarted on
        another machine): copied from its start."""
        ray, actor = self.ray, child.proc.actor  # type: ignore[union-attr]
        while True:
            data, size = ray.get(actor.read.remote(remote, offset), timeout=timeout)
            if size < offset:
                offset = 0
                continue
            if whole_lines:  # a reader of the run directory never sees half a record
                data = data[:data.rfind(b"\n") + 1]
            if data:
                local.parent.mkdir(parents=True, exist_ok=True)
                with local.open("ab") as fh:
                    fh.write(data)
                offset += len(data)
            if not data or offset >= size:
                return offset

    def copy_streams(self, chosen: list[Child] | None = None, final: bool = False) -> None:
        """The new bytes of every log and metric stream (at most every 2 s unless
        ``final``: then the last ones, half-written lines included)."""
        if not final:
            if time.time() < self.next_copy:
                return
            self.next_copy = time.time() + 2.0
        for child in chosen if chosen is not None else list(self.children.values()):
            if child.proc.pid is None or (child.name in self.released and not final):
                continue  # not placed yet (it would not answer), or gone on purpose
            for remote, local in self.streams(child):
                key = (child.name, remote)
                # restarting or gone: copied at the next chance
                with contextlib.suppress(self.ray.exceptions.RayError):
                    self.copied[key] = self.copy(child, remote, local, self.copied.get(key, 0),
                                                 whole_lines=not final
                                                 and remote.endswith(".jsonl"))

    def copy_dir(self, child: Child, remote: str) -> None:
        """Copy a directory of a component's working directory into the run directory
        (the final weights), file by file."""
        for path in self.ray.get(child.proc.actor.files.remote(remote), timeout=60):  # type: ignore[union-attr]
            local = self.run_dir / path
            tmp = local.with_name(f".{local.name}.part")
            tmp.unlink(missing_ok=True)
            self.copy(child, path, tmp, timeout=300)
            tmp.replace(local)

    def collect(self) -> None:
        """At the end: the rest of every log and metric stream, and each trainer's final
        weights, into the run directory."""
        self.copy_streams(final=True)
        for child in self.children.values():
            if child.name.startswith("trainer-") and child.finished():
                self.copy_dir(child, f"final/{child.name.removeprefix('trainer-')}")
        self.collected = True

    def start_dataflow(self) -> None:
        # a fixed port: a data layer Ray restarts binds it again, so every component
        # finds it at the URL it was given
        if not self.url:
            host = self.cfg.dataflow.host
            self.url = f"http://{host}:{self.cfg.dataflow.port or _free_port(host)}"
        port = self.url.rsplit(":", 1)[1]
        child = self.spawn("dataflow", "dataflow", "--host", self.cfg.dataflow.host,
                           "--port", port, "--store", str(self.run_dir / "store"),
                           "--config", str(self.run_dir / "config.yaml"))
        deadline = time.time() + float(self.cfg.launcher.start_timeout)
        actor = child.proc.actor  # type: ignore[union-attr]
        while True:
            with contextlib.suppress(self.ray.exceptions.RayError):
                if self.ray.get(actor.read.remote("store/url", 0), timeout=_POLL_SECONDS)[0]:
                    break
            if child.proc.poll() is not None:
                self.collect()
                raise RuntimeError(f"the data layer exited before it listened; the end of "
                                   f"{child.log}:\n{child.log_tail()}")
            if time.time() > deadline:
                raise TimeoutError(self._pending("the data layer"))
            time.sleep(0.2)
        if self.cfg.dataflow.host in ("0.0.0.0", "::"):  # every interface: tell the
            # components the address of the machine Ray placed the data layer on
            ip = self.ray.get(actor.node_ip.remote())
            self.url = f"http://{ip}:{port}"
        self.announce_url()

    @staticmethod
    def bind_dataflow(cfg: DictConfig) -> None:
        """The data layer listens wherever Ray places it (see :meth:`start_dataflow`)."""
        return None

    def wait_dataflow(self) -> None:
        """:meth:`start_dataflow` waited already: the components need the address of the
        machine Ray placed the data layer on."""

    def _pending(self, what: str) -> str:
        available = self.ray.available_resources()
        return (f"{what} did not start: Ray could not place it or it is still starting; "
                f"the cluster has free {available}")

    def start_nodes(self) -> None:
        for pool, settings in self.pools.items():
            for index in range(settings["nodes"]):
                self.start_pool_node(pool, index)

    def start_pool_node(self, pool: str, index: int) -> Child:
        # mode=sync: each iteration split over every pool's nodes
        extra = self.sync_args(sum(p["nodes"] for p in self.pools.values()))
        return self.spawn(f"raas-{pool}-{index}", "raas", *self.component_args(),
                          "--name", f"{pool}-{index}", "--pool", pool,
                          "--concurrency", str(self.cfg.node_concurrency), *extra)

    def nodes(self, pool: str = "default") -> list[Child]:
        return sorted((c for c in self.children.values()
                       if c.name.startswith(f"raas-{pool}-") and not c.retired),
                      key=lambda c: int(c.name.rsplit("-", 1)[1]))

    def add_node(self, pool: str = "default") -> Child:
        started = [int(c.rsplit("-", 1)[1]) for c in self.children
                   if c.startswith(f"raas-{pool}-")]
        return self.start_pool_node(pool, max(started, default=-1) + 1)

    def autoscalers(self) -> list[Any]:
        """One per pool: each follows the data layer's dead-band report of its own pool."""
        from astraflow.launch.local import Autoscaler

        return [Autoscaler(self, pool=pool) for pool in self.pools]

    def bundle(self, name: str) -> dict[str, float]:
        placement = self._placement(name)
        out = {"CPU": placement["num_cpus"], "GPU": placement["num_gpus"],
               **{k: float(v) for k, v in placement["resources"].items()}}
        return {k: v for k, v in out.items() if v}

    def scaled(self, pool: str) -> None:
        """Tell the Ray autoscaler what the run needs now: a bundle per component in
        service, so a cluster that is full grows (and may shrink when nodes retire).
        A request replaces the previous one; a cluster without an autoscaler ignores it."""
        bundles = [self.bundle(c.name) for c in self.children.values()
                   if not c.retired and not c.finished()]
        bundles = [b for b in bundles if b]
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=bundles)
            self.requested = True
        except Exception as exc:  # a hint to the autoscaler: the run goes on without it
            print(f"astraflow: warning: could not ask the Ray autoscaler for room: {exc}",
                  file=sys.stderr)
            return
        self.event(event="request_resources", pool=pool, bundles=len(bundles))

    def placement_waits(self, child: Child) -> None:
        """Say once that a component waits for Ray to find room for it: at its start, or
        again after its actor stopped answering (its machine left the cluster, and Ray
        restarts it where there is room)."""
        proc: RayProc = child.proc  # type: ignore[assignment]
        now = time.time()
        silent = now - proc.silent_since if proc.silent_since is not None else 0.0
        never = proc.pid is None and now - proc.spawned >= _PLACEMENT_SECONDS
        lost = proc.pid is not None and silent >= _PLACEMENT_SECONDS
        if not (never or lost):
            if proc.pid is not None and proc.silent_since is None:
                self.waiting.discard(child.name)  # placed: a later wait is said again
            return
        if child.name in self.waiting:
            return
        self.waiting.add(child.name)
        self.scaled(self.pool_of(child.name) if child.name.startswith("raas-") else "")
        again = (f" again (no answer for {silent:.0f} s: its machine may have "
                 "left the cluster)" if lost else "")
        print(f"astraflow: {child.name} waits for Ray to place it{again} (it needs "
              f"{self.bundle(child.name)}; the cluster has free "
              f"{self.ray.available_resources()}); the Ray autoscaler, if the cluster has "
              "one, was asked for room", file=sys.stderr)
        self.event(event="waiting_for_placement", component=child.name, again=lost)

    def supervise(self) -> None:
        """Ray restarts what crashed after it got to work; a component that failed in
        set-up, or that Ray gave up on, stops the run."""
        limit = int(self.cfg.launcher.max_restarts)
        self.copy_streams()
        for child in list(self.children.values()):
            proc: RayProc = child.proc  # type: ignore[assignment]
            seen = proc.restarted
            code = proc.poll()
            if proc.restarted > seen:
                print(f"astraflow: {child.name} was restarted by Ray", file=sys.stderr)
                self.event(event="restart", component=child.name, restart=proc.restarted)
            if code is None:
                self.placement_waits(child)
                continue
            if child.retired:
                self.release(child)
                continue
            if child.finished():
                continue
            self.collect()  # the log's end, for the message
            if proc.oom is not None:  # restarted, it would grow into the same death
                self.event(event="oom_kill", component=child.name, exit_code=code,
                           verdict=proc.oom.verdict, peak_bytes=proc.oom.peak,
                           limit_bytes=proc.oom.limit, evidence=proc.oom.evidence)
                raise RuntimeError(proc.oom.said(child.name, child.log))
            if proc.gone is not None:
                raise RuntimeError(f"{child.name} died and Ray did not start it again "
                                   f"(launcher.max_restarts={limit}): {proc.gone}; the end "
                                   f"of {child.log}:\n{child.log_tail()}")
            raise RuntimeError(f"{child.name} exited with {code} before it started working, "
                               f"so it is not restarted; the end of {child.log}:\n"
                               f"{child.log_tail()}")

    def stop(self, names: list[str] | None = None, timeout: float = 20.0) -> None:
        super().stop(names, timeout)
        chosen = [self.children[n] for n in (names or list(self.children))
                  if n in self.children and n not in self.released]
        if self.requested and names is None:
            with contextlib.suppress(Exception):  # the run no longer needs its room
                from ray.autoscaler.sdk import request_resources

                request_resources(bundles=[])
        if self.collected and not self.cfg.launcher.keep_work_dir:
            # a run that failed keeps them: its store and checkpoints are evidence
            self.copy_streams(chosen, final=True)
            for child in chosen:  # one after the other: the last removes the run's
                with contextlib.suppress(Exception):  # directory, once it is empty
                    self.ray.get(child.proc.actor.remove_work.remote(),  # type: ignore[union-attr]
                                 timeout=120)
        for child in chosen:
            with contextlib.suppress(Exception):  # already gone
                child.proc.kill()

    def retire(self, child: Child) -> None:
        super().retire(child)  # SIGTERM: the node finishes its leases and leaves
        if child.proc.pid is None:  # never placed: nothing to wait for
            self.released.add(child.name)
            with contextlib.suppress(Exception):
                child.proc.kill()

    def release(self, child: Child) -> None:
        """A retired node that has left: its log's end copied, its working directory
        removed, its actor ended, so Ray can give its resources to others."""
        if child.name in self.released:
            return
        self.released.add(child.name)
        self.copy_streams([child], final=True)
        with contextlib.suppress(Exception):
            if not self.cfg.launcher.keep_work_dir:
                self.ray.get(child.proc.actor.remove_work.remote(), timeout=60)  # type: ignore[union-attr]
            child.proc.kill()



def run(cfg: DictConfig) -> int:
    from astraflow.launch.local import run as run_with

    # set-up mistakes are said before anything starts: no Ray, or nobody at the address
    # (at once); then the user's files (checked before the run directory is made); then
    # a cluster that refuses this machine (RayRun joins it)
    import_ray()
    pool_settings(cfg)  # a mistyped pool setting
    check_trainer_gpus(cfg)
    check_address(cfg.launcher.address)
    return run_with(cfg, job_cls=RayRun)


def check_trainer_gpus(cfg: DictConfig) -> None:
    """A trainer of several ranks on GPUs takes one GPU a rank: its actor must ask Ray
    for exactly that many (none trains on CPUs), or ranks would share a GPU or miss one."""
    world = int(cfg.trainer.get("world_size", 1) or 1)
    gpus = float(cfg.launcher.trainer.num_gpus)
    if gpus and gpus != world:
        raise ConfigError(f"launcher.trainer.num_gpus={gpus:g} but trainer.world_size={world}: "
                          f"each rank of the trainer takes one GPU; set "
                          f"launcher.trainer.num_gpus={world} (or 0 to train on CPUs)")


def check_address(address: str | None) -> None:
    """A HOST:PORT nobody answers on, or a cluster that refuses this machine's token, is
    a set-up mistake: said at once, where Ray itself would retry for half a minute or
    more."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except (OSError, ValueError) as exc:
        raise ConfigError(f"launcher.address={address}: no Ray cluster answers there "
                          f"({exc}); start one with `ray start --head`, or leave "
                          "launcher.address unset to start one for this run") from None
    ray = import_ray()
    try:  # what `ray status` asks first; Ray's own API, so any other failure is
        # left to ray.init to report
        from ray._raylet import GcsClient

        GcsClient(address=address)
    except ray.exceptions.AuthenticationError:
        raise ConfigError(_refused(address)) from None
    except Exception:
        pass


def _refused(address: str | None) -> str:
    return (f"launcher.address={address}: the Ray cluster refused this machine's token; "
            "give it the cluster's (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
            "~/.ray/auth_token, with RAY_AUTH_MODE=token)")
