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
directory is the driver's; components write to it by path, so machines other than the
driver's need it at the same path (a shared file system).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from astraflow.errors import ConfigError
from astraflow.launch.lifecycle import LAUNCHER_ENV, READY_ENV
from astraflow.launch.local import Child, LocalRun
from astraflow.security import TOKEN_ENV

#: how long a poll of an actor may take before the component is taken as still running
_POLL_SECONDS = 10.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("launcher=ray needs Ray: pip install 'astraflow[ray]'") from None
    return ray


def _component_actor(ray: Any) -> Any:
    @ray.remote
    class Component:
        """Owns one component process on the machine Ray placed it on."""

        def __init__(self, argv: list[str], env: dict[str, str], log: str) -> None:
            import subprocess
            import threading

            self.stopping = False
            os.makedirs(os.path.dirname(log), exist_ok=True)
            # the component ends with this actor (SIGTERM on its death, however it dies)
            env = {**os.environ, **env, LAUNCHER_ENV: str(os.getpid())}
            with open(log, "ab") as fh:
                self.proc = subprocess.Popen([sys.executable, "-m", "astraflow", *argv],
                                             stdout=fh, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)
            self.ready = env.get(READY_ENV)
            threading.Thread(target=self._watch, daemon=True).start()

        def _watch(self) -> None:
            code = self.proc.wait()
            worked = self.ready is not None and os.path.exists(self.ready)
            if code != 0 and worked and not self.stopping:
                os._exit(1)  # Ray restarts this actor, and so the component

        def poll(self) -> tuple[int | None, int]:
            return self.proc.poll(), self.proc.pid

        def node_ip(self) -> str:
            import ray

            return ray.util.get_node_ip_address()

        def terminate(self) -> None:
            self.stopping = True
            if self.proc.poll() is None:
                self.proc.terminate()

    return Component


class RayProc:
    """The face of a component's actor that the launcher supervises (as a Popen)."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self.ray, self.actor = ray, actor
        self.returncode: int | None = None
        self.pid: int | None = None
        self.restarted = 0  # times Ray restarted it, as seen by the launcher
        self.gone: str | None = None  # why the actor is dead for good

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ray = self.ray
        try:
            code, pid = ray.get(self.actor.poll.remote(), timeout=_POLL_SECONDS)
        except ray.exceptions.GetTimeoutError:
            return None
        except ray.exceptions.ActorUnavailableError:
            return None  # being restarted
        except ray.exceptions.RayActorError as exc:
            self.gone = str(exc).strip().splitlines()[0] if str(exc).strip() else "died"
            self.returncode = -1
            return self.returncode
        if self.pid is not None and pid != self.pid:
            self.restarted += 1
        self.pid = pid
        self.returncode = code
        return code

    def terminate(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.actor.terminate.remote()

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.time() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.time() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired("ray actor", timeout or 0)
            time.sleep(0.2)
        return int(self.returncode or 0)

    def kill(self) -> None:
        self.ray.kill(self.actor, no_restart=True)
        self.returncode = self.returncode if self.returncode is not None else -9


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class RayRun(LocalRun):
    ray: Any = None
    actor_cls: Any = None
    #: pool name -> its settings (nodes, num_cpus, num_gpus, resources)
    pools: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ray = import_ray()
        self.pools = self._pool_settings()
        launcher = self.cfg.launcher
        if not self.ray.is_initialized():
            address = launcher.get("address") or None
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            if address is None:  # a cluster of this machine, for this run
                kwargs["num_cpus"] = max(os.cpu_count() or 1, self.cpus_needed())
                kwargs["resources"] = dict(launcher.get("local_resources") or {})
            self.ray.init(address=address, **kwargs)
        self.actor_cls = _component_actor(self.ray)

    # -- what runs where ----------------------------------------------------------------
    def _pool_settings(self) -> dict[str, dict[str, Any]]:
        pools = self.cfg.launcher.get("pools") or {}
        out = {}
        for name, pool in pools.items():
            out[str(name)] = {"nodes": int(pool.get("nodes", 1)),
                              "num_cpus": float(pool.get("num_cpus", 1)),
                              "num_gpus": float(pool.get("num_gpus", 0)),
                              "resources": dict(pool.get("resources") or {})}
        if not out:
            out["default"] = {"nodes": int(self.cfg.num_nodes), "num_cpus": 1.0,
                              "num_gpus": 0.0, "resources": {}}
        return out

    def _placement(self, name: str) -> dict[str, Any]:
        launcher = self.cfg.launcher
        if name.startswith("raas-"):
            pool = self.pools[self.pool_of(name)]
            return {k: pool[k] for k in ("num_cpus", "num_gpus", "resources")}
        kind = name.split("-", 1)[0]  # dataflow | trainer | eval
        spec = launcher.get({"eval": "evaluator"}.get(kind, kind)) or {}
        return {"num_cpus": float(spec.get("num_cpus", 1 if kind == "trainer" else 0)),
                "num_gpus": float(spec.get("num_gpus", 0)),
                "resources": dict(spec.get("resources") or {})}

    def cpus_needed(self) -> int:
        nodes = sum(p["num_cpus"] * p["nodes"] for p in self.pools.values())
        trainers = len(self.cfg.get("policies") or {"policy": None})
        return int(nodes + trainers + 1)

    @staticmethod
    def pool_of(name: str) -> str:
        return name.removeprefix("raas-").rsplit("-", 1)[0]

    # -- life cycle ---------------------------------------------------------------------
    def spawn(self, name: str, *args: str) -> Child:
        log = self.run_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {TOKEN_ENV: self.token, READY_ENV: str(log.with_suffix(".ready")),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        placement = self._placement(name)
        restarts = int(self.cfg.launcher.get("max_restarts", 3))
        actor = self.actor_cls.options(
            name=None, max_restarts=restarts, max_task_retries=0,
            num_cpus=placement["num_cpus"], num_gpus=placement["num_gpus"],
            resources=placement["resources"] or None,
        ).remote(list(args), env, str(log))
        previous = self.children.get(name)
        child = Child(name, args, RayProc(self.ray, actor), log,  # type: ignore[arg-type]
                      previous.restarts if previous else 0)
        self.children[name] = child
        return child

    def start_dataflow(self) -> None:
        # a fixed port: a data layer Ray restarts binds it again, so every component
        # finds it at the URL it was given
        if not self.url:
            host = self.cfg.dataflow.host
            self.url = f"http://{host}:{self.cfg.dataflow.port or _free_port(host)}"
        port = self.url.rsplit(":", 1)[1]
        store = self.run_dir / "store"
        url_file = store / "url"
        url_file.unlink(missing_ok=True)
        child = self.spawn("dataflow", "dataflow", "--host", self.cfg.dataflow.host,
                           "--port", port, "--store", str(store),
                           "--config", str(self.run_dir / "config.yaml"))
        deadline = time.time() + float(self.cfg.launcher.get("start_timeout", 300))
        while not url_file.exists():
            if child.proc.poll() is not None:
                raise RuntimeError(f"the data layer exited before it listened; the end of "
                                   f"{child.log}:\n{child.log_tail()}")
            if time.time() > deadline:
                raise TimeoutError(self._pending("the data layer"))
            time.sleep(0.1)
        self.url = url_file.read_text().strip()
        if self.cfg.dataflow.host in ("0.0.0.0", "::"):  # every interface: tell the
            # components the address of the machine Ray placed the data layer on
            ip = self.ray.get(child.proc.actor.node_ip.remote())  # type: ignore[attr-defined]
            self.url = f"http://{ip}:{port}"
        child.ready_file.touch()

    def _pending(self, what: str) -> str:
        available = self.ray.available_resources()
        return (f"{what} did not start: Ray could not place it or it is still starting; "
                f"the cluster has free {available}")

    def start_nodes(self) -> None:
        for pool, settings in self.pools.items():
            for index in range(settings["nodes"]):
                self.start_pool_node(pool, index)

    def start_pool_node(self, pool: str, index: int) -> Child:
        extra = []
        if self.cfg.mode == "sync":  # each iteration split over every pool's nodes
            nodes = sum(p["nodes"] for p in self.pools.values())
            per_iteration = math.ceil(self.cfg.batch_size / self.cfg.group_size)
            extra = ["--sync-tasks", str(math.ceil(per_iteration / nodes))]
        return self.spawn(f"raas-{pool}-{index}", "raas", *self.component_args(),
                          "--name", f"{pool}-{index}", "--pool", pool,
                          "--concurrency", str(self.cfg.node_concurrency), *extra)

    def start_node(self, index: int) -> Child:  # the autoscaler's: the first pool's
        return self.start_pool_node(next(iter(self.pools)), index)

    def nodes(self) -> list[Child]:
        first = next(iter(self.pools))
        return sorted((c for c in self.children.values()
                       if c.name.startswith(f"raas-{first}-") and not c.retired),
                      key=lambda c: int(c.name.rsplit("-", 1)[1]))

    def supervise(self) -> None:
        """Ray restarts what crashed after it got to work; a component that failed in
        set-up, or that Ray gave up on, stops the run."""
        limit = int(self.cfg.launcher.get("max_restarts", 3))
        for child in list(self.children.values()):
            proc: RayProc = child.proc  # type: ignore[assignment]
            seen = proc.restarted
            code = proc.poll()
            if proc.restarted > seen:
                print(f"astraflow: {child.name} was restarted by Ray", file=sys.stderr)
                self.event(event="restart", component=child.name, restart=proc.restarted)
            if code is None or child.retired or child.finished():
                continue
            if proc.gone is not None:
                raise RuntimeError(f"{child.name} died and Ray did not start it again "
                                   f"(launcher.max_restarts={limit}): {proc.gone}; the end "
                                   f"of {child.log}:\n{child.log_tail()}")
            raise RuntimeError(f"{child.name} exited with {code} before it started working, "
                               f"so it is not restarted; the end of {child.log}:\n"
                               f"{child.log_tail()}")

    def stop(self, names: list[str] | None = None, timeout: float = 20.0) -> None:
        super().stop(names, timeout)
        chosen = [self.children[n] for n in (names or list(self.children)) if n in self.children]
        for child in chosen:
            with contextlib.suppress(Exception):  # already gone
                child.proc.kill()


def run(cfg: DictConfig) -> int:
    from astraflow.launch.local import run as run_with

    import_ray()  # the missing extra is a set-up mistake: said before anything starts
    check_address(cfg.launcher.get("address"))
    return run_with(cfg, job_cls=RayRun)


def check_address(address: str | None) -> None:
    """A HOST:PORT nobody answers on is a set-up mistake: said at once, where Ray itself
    would retry for minutes."""
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
