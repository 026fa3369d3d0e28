"""The launcher's end of the preloaded parent (:mod:`.preload_server`).

Each component of a local run used to start as ``python -m astraflow ...`` and import
torch and transformers itself -- about 4 s of CPU each, all at once on the same cores.
With ``launcher.preload`` (the default) the launcher starts one parent that imports them
and the selected plugins' modules once, and forks every Python component from it. A
forked component keeps what a fresh start gave it: the launcher as its parent, its own
session and process group, its log, its command line in ``ps``, signals and restarts.
Where a fork is not safe (no ``fork`` on the platform, a preloaded module started a
thread or an accelerator) the launcher says so in one line and starts components as
before. The data layer imports no torch and is started as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from astraflow.lifecycle import LAUNCHER_ENV

#: modules every Python component imports, heavy ones first
BASE_MODULES = ("numpy", "torch", "transformers", "transformers.modeling_utils",
                "safetensors.torch", "astraflow.launch.components", "astraflow.raas.node",
                "astraflow.trainer.runtime", "astraflow.evaluate")
#: kinds whose selected implementation a component imports -> the config group naming it
SELECTED = {"rollout_backend": "raas", "trainer_backend": "trainer", "workflow": "workflow",
            "task": "task", "reward": "reward"}
#: longest the launcher waits for the parent's imports, and for one fork
IMPORT_TIMEOUT = 300.0
FORK_TIMEOUT = 30.0


def modules_for(cfg: DictConfig) -> list[str]:
    """What the parent imports for this run: torch, transformers, the core's component
    modules and the implementations of the selected plugins (their ``module:attr``)."""
    from astraflow.plugins import get_registry

    names = [m for m in BASE_MODULES if _installed(m)]
    registry = get_registry()
    for kind, group in SELECTED.items():
        section = cfg.get(group)
        if section is None or section.get("name") is None:
            continue
        try:
            factory = registry.get(kind, section.name).factory
        except Exception:  # an unknown option is the pre-flight's to report
            continue
        if isinstance(factory, str):
            names.append(factory.partition(":")[0])
    return list(dict.fromkeys(names))


def model_modules(model_path: str | None) -> list[str]:
    """The modelling module of a checkpoint's architecture (``transformers.models.llama
    .modeling_llama`` for a Llama), which ``from_pretrained`` would import in each
    component."""
    if not model_path:
        return []
    try:
        model_type = json.loads((Path(model_path) / "config.json").read_text())["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    name = f"transformers.models.{model_type}.modeling_{model_type}"
    return [name] if _installed(name) else []


def _installed(name: str) -> bool:
    """Whether ``name``'s top-level package is installed, asked without importing
    anything (``find_spec`` of a submodule imports its parents: a second of transformers
    in the launcher). A submodule that is missing fails in the parent, which says so."""
    try:
        return importlib.util.find_spec(name.partition(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def available() -> str | None:
    """Why components cannot be forked on this platform, or None."""
    if not hasattr(os, "fork") or sys.platform != "linux":
        return f"no fork with adoption on {sys.platform}"
    return None


def parent_env() -> dict[str, str]:
    """The parent's environment: the launcher's, which its components get too (a library
    may read a variable as it is imported), one torch thread by default, and the
    launcher's pid, so that the parent dies with it."""
    env = dict(os.environ, **{LAUNCHER_ENV: str(os.getpid())})
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_early(overrides: list[str]) -> Preloader | None:
    """The parent started before the run's config is composed, importing torch and
    transformers meanwhile (the selected plugins follow, :meth:`Preloader.preload`); its
    log is a temporary file until the run directory exists (:meth:`Preloader.move_log`).
    None where components cannot be forked here, or the command line says they will not
    be (``launcher.preload=false``, ``launcher=ray``); a config that says so otherwise (an
    experiment preset) ends it once composed."""
    said = {o.lstrip("+").replace(" ", "").lower() for o in overrides}
    if available() is not None or said & {"launcher.preload=false", "launcher=ray"}:
        return None
    fd, log = tempfile.mkstemp(prefix="astraflow-preload-", suffix=".log")
    os.close(fd)
    return Preloader(Path(log), parent_env(), [m for m in BASE_MODULES if _installed(m)],
                     temporary=True)


def become_subreaper() -> None:
    """Make this process adopt its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``):
    a component forked through a go-between that exits becomes the launcher's child."""
    pr_set_child_subreaper = 36
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


class ForkedProcess:
    """The part of :class:`subprocess.Popen` the launcher uses, for a component it
    adopted: ``pid``, ``returncode``, ``poll``, ``wait``, ``terminate``, ``kill``."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its code unknown
                self.returncode = 255
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Preloader:
    """Starts the preloaded parent and asks it for components. Any failure of the parent
    (it died, hangs, or found forking unsafe) is said once, and from then on
    :meth:`fork` returns None: the launcher starts components fresh."""

    def __init__(self, log: Path, env: dict[str, str], modules: list[str],
                 temporary: bool = False) -> None:
        become_subreaper()
        self.log = log
        #: the log is a temporary file, removed at the end unless moved into a run
        self.temporary = temporary
        ours, theirs = socket.socketpair()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "astraflow", "_preload", "--fd", str(theirs.fileno())],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock = ours
        self.reader = ours.makefile("rb")
        self.pending = 0  # import and log requests not answered yet
        self.failed: str | None = None
        self.import_seconds: float | None = None
        self.preload(modules)

    def preload(self, modules: list[str]) -> None:
        """Ask the parent to import more (answered before the next fork)."""
        if modules and self.failed is None:
            self._send({"op": "import", "modules": modules})
            self.pending += 1

    def move_log(self, path: Path) -> None:
        """From now on the parent (and what it wrote so far) logs to ``path``."""
        if self.failed is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._send({"op": "log", "path": str(path), "previous": str(self.log)})
            self.pending += 1
            self.log, self.temporary = path, False

    def fork(self, args: list[str], env: dict[str, str], log: Path) -> ForkedProcess | None:
        """``python -m astraflow ARGS`` forked from the parent, or None: start it fresh."""
        if self.failed is not None:
            return None
        try:
            self.sock.settimeout(IMPORT_TIMEOUT)
            while self.pending:
                reply = self._reply()
                self.pending -= 1
                if "unsafe" in reply:
                    self._fail(f"forking is not safe: {reply['unsafe']}")
                    return None
                self.import_seconds = (self.import_seconds or 0.0) + reply.get("seconds", 0.0)
            self.sock.settimeout(FORK_TIMEOUT)
            self._send({"op": "fork", "args": args, "env": env, "cwd": os.getcwd(),
                        "log": str(log)})
            reply = self._reply()
        except (OSError, ValueError) as exc:  # a timeout is an OSError
            self._fail(f"the preloaded parent stopped answering ({exc or 'timeout'})")
            return None
        if "pid" not in reply:
            self._fail(f"the preloaded parent could not fork: {reply.get('error')}")
            return None
        return ForkedProcess(int(reply["pid"]), [sys.executable, "-m", "astraflow", *args])

    def known(self) -> set[int]:
        return {self.proc.pid}

    def close(self) -> None:
        """End the parent at once: it holds nothing worth a clean exit (its components are
        the launcher's children), and a run that stops on a set-up mistake would wait for
        it to finish importing before it read its socket again."""
        with contextlib.suppress(OSError):
            self.reader.close()
            self.sock.close()
        self.proc.kill()
        self.proc.wait()
        if self.temporary:
            self.log.unlink(missing_ok=True)

    def _send(self, request: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(request).encode() + b"\n")

    def _reply(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise ValueError(f"it exited with {self.proc.poll()}")
        said: dict[str, Any] = json.loads(line)
        return said

    def _fail(self, why: str) -> None:
        self.failed = why
        print(f"astraflow: starting components without the preloaded parent: {why}",
              file=sys.stderr)
        self.close()
        return None


def reap_orphans(known: set[int]) -> None:
    """Reap exited processes the launcher adopted as a subreaper and does not track (an
    engine's helper whose component was killed): otherwise they stay zombies."""
    me = os.getpid()
    for path in Path(f"/proc/{me}/task").glob("*/children"):
        try:
            children = [int(p) for p in path.read_text().split()]
        except (OSError, ValueError):
            continue
        for pid in children:
            if pid not in known:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
