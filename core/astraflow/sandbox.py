"""Runs untrusted, model-written Python without letting it reach the node that runs it.

A program may loop forever, fork without end, allocate all memory, print without end,
open sockets, write anywhere or signal the trainer. Each of those ends as a
:class:`SandboxResult` with a status, and the caller carries on. No single mechanism
holds against all of them, so the run stacks layers, each covering another's gaps
(:attr:`Sandbox.layers` names the ones in force where it runs):

- ``netns``/``pidns``: fresh user, network and PID namespaces (``network="namespace"``):
  no interface but a downed loopback, and when the program's first process ends the
  kernel kills every process it left, even one that escaped its process group.
- ``landlock-fs``/``-tcp``/``-scope``: the kernel refuses writes outside the private
  directory, TCP bind/connect, and signals to processes outside the sandbox, for the
  program and everything it starts -- through libc or ``sh`` as much as through Python.
- ``cgroup-pids``: a pids cgroup caps the tasks (as root RLIMIT_NPROC does not count).
- ``rlimits``: address space, CPU seconds, file size, no core dumps; ``rlimit-nproc``
  when the program runs as a non-root user, for whom the kernel enforces it.
- ``nocaps``: no capabilities, so root's cannot undo any of the above.
- ``audit``: ``sys.addaudithook`` refusals inside the interpreter -- writes outside the
  directory, sockets and name lookups (``network="refuse"``), and, where Landlock is
  missing, starting programs, ``ctypes`` and signals outside the process group. Code
  can get past a hook with enough effort; the kernel layers are the ones that hold.
- the process group is killed (``SIGKILL``) on timeout and after every run.

The child is :mod:`astraflow.sandbox_child` run as a script, which imports the standard
library only; this module imports asyncio only inside the functions that use it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.sandbox_child import LAYERS_ENV, MEMORY_EXIT, SETUP_FAILED
from astraflow.schema import check_instance, setting

if TYPE_CHECKING:
    import asyncio

NETWORK_MODES = ("auto", "namespace", "refuse")
_CHILD = str(Path(__file__).with_name("sandbox_child.py").resolve())
#: after the program ends, how long its pipes may stay open (a process that escaped
#: every kill holding them) before the output is taken as it is
_DRAIN_SECONDS = 1.0
_PROBE = f"import os\nprint(os.environ.get({LAYERS_ENV!r}, ''))\n"
_probed: dict[str, SandboxResult] = {}
_probe_lock = threading.Lock()


@dataclass
class SandboxConfig:
    """Limits of one run. ``network``: ``namespace`` (a fresh network namespace),
    ``refuse`` (the interpreter refuses sockets), ``auto`` (namespace where the kernel
    allows one, else refuse)."""

    #: wall-clock seconds per run; the whole process group is killed
    timeout: float = setting(5.0, gt=0)
    memory_mb: int = setting(512, ge=1)  # address space (RLIMIT_AS) of each process
    #: processes and threads at once: a fork bomb fails to fork
    max_processes: int = setting(32, ge=1)
    #: stdout and stderr each; beyond it the run is killed
    max_output_bytes: int = setting(65536, ge=1)
    concurrency: int = setting(4, ge=1)  # runs at once per Sandbox; the others wait
    network: str = setting("auto", choices=NETWORK_MODES)
    #: RLIMIT_CPU
    cpu_seconds: int = setting(0, ge=0, why="0: the timeout plus one second")
    #: largest file the program may write (RLIMIT_FSIZE)
    max_file_mb: int = setting(64, ge=1)


@dataclass
class SandboxResult:
    """How a run ended. ``status``: ``ok`` (exit 0), ``error`` (non-zero exit),
    ``timeout``, ``memory`` (MemoryError, or killed by the kernel), ``output_limit``
    (printed more than ``max_output_bytes``), ``sandbox_error`` (the sandbox could not
    confine the program, which therefore did not run). ``pid`` is the run's process
    group, gone when the run returns."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox:
    """Runs programs, ``concurrency`` at a time: :meth:`run` calls share one limit per
    event loop, :meth:`run_sync` calls (from any threads) share another.

    The network mode is decided once, here, by running a probe program: a sandbox that
    cannot confine anything fails now, in one line, not on every sample later.
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        # a sandbox is also built in code, not only from a checked run config: the limits
        # its settings declare are checked here too
        if wrong := check_instance(self.config, "sandbox."):
            raise ValueError("; ".join(wrong))
        self._cgroup_parent = _pids_cgroup_parent()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._slots = weakref.WeakKeyDictionary()
        self._sync_slots = threading.BoundedSemaphore(self.config.concurrency)
        self.network_mode = self._choose_network()
        self.layers: tuple[str, ...] = tuple(
            filter(None, self._probe(self.network_mode).stdout.strip().split(",")))

    async def run(self, code: str, stdin: str = "", files: dict[str, str] | None = None,
                  timeout: float | None = None) -> SandboxResult:
        """Run ``code`` with ``stdin`` in a fresh directory holding ``files`` (relative
        path: text). Never raises for what the program does."""
        import asyncio

        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.config.concurrency))
        async with slots:
            return await self._execute(code, stdin, files, timeout, self.network_mode)

    def run_sync(self, code: str, stdin: str = "", files: dict[str, str] | None = None,
                 timeout: float | None = None) -> SandboxResult:
        """:meth:`run` for callers without an event loop (blocks the calling thread)."""
        with self._sync_slots:
            return _in_new_loop(self._execute(code, stdin, files, timeout, self.network_mode))

    def _choose_network(self) -> str:
        wanted = self.config.network
        if wanted in ("auto", "namespace"):
            probe = self._probe("namespace")
            if probe.ok:
                return "namespace"
            if wanted == "namespace":
                raise RuntimeError(f"sandbox network='namespace' is not available here "
                                   f"({_last_line(probe.stderr)}); use network='refuse'")
        probe = self._probe("refuse")
        if not probe.ok:
            raise RuntimeError(f"the sandbox cannot run programs here: {_last_line(probe.stderr)}")
        return "refuse"

    def _probe(self, mode: str) -> SandboxResult:
        with _probe_lock:
            if mode not in _probed:
                _probed[mode] = _in_new_loop(self._execute(_PROBE, "", None, 30.0, mode))
            return _probed[mode]

    async def _execute(self, code: str, stdin: str, files: dict[str, str] | None,
                       timeout: float | None, mode: str) -> SandboxResult:
        import asyncio

        config = self.config
        limit = config.timeout if timeout is None else timeout
        root = Path(tempfile.mkdtemp(prefix="astraflow-sandbox-")).resolve()
        cgroup: Path | None = None
        proc: asyncio.subprocess.Process | None = None
        tasks: list[asyncio.Task[Any]] = []
        try:
            work, tmp, program = root / "work", root / "tmp", root / "program.py"
            work.mkdir()
            tmp.mkdir()
            _write_files(work, files or {})
            program.write_text(code, encoding="utf-8")
            cgroup = self._new_cgroup()
            settings = {
                "work": str(work), "tmp": str(tmp), "program": str(program), "network": mode,
                "cgroup": str(cgroup) if cgroup else "",
                "memory_bytes": config.memory_mb * 2**20,
                "cpu_seconds": config.cpu_seconds or math.ceil(limit) + 1,
                "max_processes": config.max_processes,
                "max_file_bytes": config.max_file_mb * 2**20,
            }
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work),
                   "TMPDIR": str(tmp), "LANG": "C.UTF-8"}
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", _CHILD, json.dumps(settings),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=work, env=env, start_new_session=True)
            over = asyncio.Event()
            out, err = bytearray(), bytearray()
            exited, overflow = (asyncio.create_task(proc.wait()),
                                asyncio.create_task(over.wait()))
            tasks = [exited, overflow, asyncio.create_task(_feed(proc.stdin, stdin.encode())),
                     asyncio.create_task(_drain(proc.stdout, out, config.max_output_bytes, over)),
                     asyncio.create_task(_drain(proc.stderr, err, config.max_output_bytes, over))]
            done, _ = await asyncio.wait({exited, overflow}, timeout=limit,
                                         return_when=asyncio.FIRST_COMPLETED)
            overflow.cancel()
            _kill(proc.pid, cgroup)
            returncode = await exited
            seconds = time.monotonic() - started
            _kill(proc.pid, cgroup)  # whatever the program left in its group
            await asyncio.wait(tasks[2:], timeout=_DRAIN_SECONDS)
            if not done:
                status = "timeout"
            elif over.is_set():
                status = "output_limit"
            else:
                status = _status(returncode)
            return SandboxResult(status, returncode, out.decode("utf-8", "replace"),
                                 err.decode("utf-8", "replace"), seconds, proc.pid)
        finally:  # also when the caller cancels the run (e.g. its own timeout)
            for task in tasks:
                task.cancel()
            if proc is not None and proc.returncode is None:
                _kill(proc.pid, cgroup)
            shutil.rmtree(root, ignore_errors=True)  # before any await: a closed loop
            if cgroup is not None:  # may never resume this coroutine
                await _remove_cgroup(cgroup)

    def _new_cgroup(self) -> Path | None:
        if self._cgroup_parent is None:
            return None
        cgroup = self._cgroup_parent / f"astraflow-sandbox-{uuid.uuid4().hex[:16]}"
        cgroup.mkdir()
        (cgroup / "pids.max").write_text(str(self.config.max_processes + 1))  # +1: the relay
        return cgroup


def _in_new_loop(coroutine: Coroutine[Any, Any, SandboxResult]) -> SandboxResult:
    """Runs ``coroutine`` to the end, on a thread of its own if this one has a loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1, thread_name_prefix="sandbox") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _write_files(work: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        target = (work / name).resolve()
        if not target.is_relative_to(work) or target == work:
            raise ValueError(f"sandbox files: {name!r} is not a relative path inside the "
                             "program's directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes) -> None:
    if pipe is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    pipe.close()


async def _drain(pipe: asyncio.StreamReader | None, into: bytearray, limit: int,
                 over: asyncio.Event) -> None:
    """Reads to the end, keeping ``limit`` bytes: a pipe nobody reads would block the
    program, and one read after the other could deadlock with it."""
    if pipe is None:
        return
    while chunk := await pipe.read(65536):
        room = limit - len(into)
        into += chunk[:max(room, 0)]
        if len(chunk) > room:
            over.set()


def _kill(pgid: int | None, cgroup: Path | None) -> None:
    """SIGKILL to the run's process group, and to every task of its cgroup: those also
    hold the processes that left the group (setsid)."""
    pids = [-pgid] if pgid else []
    if cgroup is not None:
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


async def _remove_cgroup(cgroup: Path, seconds: float = 5.0) -> None:
    """A cgroup can be removed once its last task is reaped, shortly after the kill."""
    import asyncio

    deadline = time.monotonic() + seconds
    while cgroup.exists() and time.monotonic() < deadline:
        _kill(None, cgroup)
        with contextlib.suppress(OSError):
            cgroup.rmdir()
            return
        await asyncio.sleep(0.01)


def _pids_cgroup_parent() -> Path | None:
    """Where this process may create pids cgroups (cgroup v1 or v2), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = {}  # controller ("" for cgroup v2): this process's cgroup
    for _, controllers, path in (line.split(":", 2) for line in memberships):
        paths.update(dict.fromkeys(controllers.split(","), path.lstrip("/")))
    for _, point, fstype, options, *_ in (line.split() for line in mounts):
        v1 = fstype == "cgroup" and "pids" in options.split(",") and "pids" in paths
        if not (v1 or (fstype == "cgroup2" and "" in paths)):
            continue
        candidate = Path(point) / paths["pids" if v1 else ""]
        probe = candidate / f"astraflow-sandbox-probe-{uuid.uuid4().hex[:8]}"
        try:
            if not v1 and "pids" not in (candidate / "cgroup.subtree_control").read_text():
                continue
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        return candidate
    return None


def _status(returncode: int) -> str:
    if returncode == 0:
        return "ok"
    if returncode == SETUP_FAILED:
        return "sandbox_error"
    if returncode in (MEMORY_EXIT, -signal.SIGKILL):  # an unexplained SIGKILL: OOM killer
        return "memory"
    if returncode == -signal.SIGXCPU:
        return "timeout"
    return "error"


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]
