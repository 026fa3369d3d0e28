"""One sandboxed run: a private directory holding the program and its files, the child
(:mod:`astraflow.sandbox.child`) started on it in a session of its own, its pipes read
within the output limit, the timeout, and the kill and clean-up that follow every run,
also one its caller cancels.

asyncio is imported only inside the functions that use it.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.sandbox.cgroups import kill, new_cgroup, remove_cgroup
from astraflow.sandbox.config import SandboxConfig
from astraflow.sandbox.result import SandboxResult, status_of

if TYPE_CHECKING:
    import asyncio

#: the child, run as a script by path (``python -I``): it imports no astraflow module
CHILD = str(Path(__file__).with_name("child.py").resolve())
#: after the program ends, how long its pipes may stay open (a process that escaped
#: every kill holding them) before the output is taken as it is
DRAIN_SECONDS = 1.0
#: the program's PATH (nothing of the caller's environment is passed on)
_PATH = "/usr/local/bin:/usr/bin:/bin"


async def execute(
    config: SandboxConfig,
    code: str,
    stdin: str,
    files: dict[str, str] | None,
    timeout: float | None,
    network: str,
    cgroup_parent: Path | None,
) -> SandboxResult:
    """Runs ``code`` confined as ``config`` says, with the ``network`` mode given and a
    pids cgroup under ``cgroup_parent`` (if any); ``timeout`` overrides the config's.
    Raises only when the run cannot be set up (e.g. ``files`` names a path outside the
    program's directory), never for what the program does."""
    import asyncio

    limit = config.timeout if timeout is None else timeout
    root = Path(tempfile.mkdtemp(prefix="astraflow-sandbox-")).resolve()
    cgroup: Path | None = None
    proc: asyncio.subprocess.Process | None = None
    tasks: list[asyncio.Task[Any]] = []
    try:
        work, tmp, program = root / "work", root / "tmp", root / "program.py"
        work.mkdir()
        tmp.mkdir()
        write_files(work, files or {})
        program.write_text(code, encoding="utf-8")
        cgroup = new_cgroup(cgroup_parent, config.max_processes)
        settings = {
            "work": str(work),
            "tmp": str(tmp),
            "program": str(program),
            "network": network,
            "cgroup": str(cgroup) if cgroup else "",
            "memory_bytes": config.memory_mb * 2**20,
            "cpu_seconds": config.cpu_seconds or math.ceil(limit) + 1,
            "max_processes": config.max_processes,
            "max_file_bytes": config.max_file_mb * 2**20,
        }
        env = {"PATH": _PATH, "HOME": str(work), "TMPDIR": str(tmp), "LANG": "C.UTF-8"}

        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", CHILD, json.dumps(settings),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=work,
            env=env,
            start_new_session=True,
        )
        over = asyncio.Event()
        out, err = bytearray(), bytearray()
        exited = asyncio.create_task(proc.wait())
        overflow = asyncio.create_task(over.wait())
        tasks = [
            exited,
            overflow,
            asyncio.create_task(_feed(proc.stdin, stdin.encode())),
            asyncio.create_task(_drain(proc.stdout, out, config.max_output_bytes, over)),
            asyncio.create_task(_drain(proc.stderr, err, config.max_output_bytes, over)),
        ]
        done, _ = await asyncio.wait(
            {exited, overflow}, timeout=limit, return_when=asyncio.FIRST_COMPLETED
        )
        overflow.cancel()
        kill(proc.pid, cgroup)
        returncode = await exited
        seconds = time.monotonic() - started
        kill(proc.pid, cgroup)  # whatever the program left in its group
        await asyncio.wait(tasks[2:], timeout=DRAIN_SECONDS)

        if not done:
            status = "timeout"
        elif over.is_set():
            status = "output_limit"
        else:
            status = status_of(returncode)
        return SandboxResult(
            status,
            returncode,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            seconds,
            proc.pid,
        )
    finally:  # also when the caller cancels the run (e.g. its own timeout)
        for task in tasks:
            task.cancel()
        if proc is not None and proc.returncode is None:
            kill(proc.pid, cgroup)
        # removed before any await: a closed loop may never resume this coroutine
        shutil.rmtree(root, ignore_errors=True)
        if cgroup is not None:
            await remove_cgroup(cgroup)


def run_in_new_loop(coroutine: Coroutine[Any, Any, SandboxResult]) -> SandboxResult:
    """Runs ``coroutine`` to the end, on a thread of its own if this one has a loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1, thread_name_prefix="sandbox") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def write_files(work: Path, files: dict[str, str]) -> None:
    """Writes ``files`` (relative path: text) under ``work``; a path that leads out of it
    is a ValueError."""
    for name, text in files.items():
        target = (work / name).resolve()
        if not target.is_relative_to(work) or target == work:
            raise ValueError(
                f"sandbox files: {name!r} is not a relative path inside the "
                "program's directory"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes) -> None:
    """Writes ``data`` to the program's stdin and closes it; a program that exits
    without reading it all is no error."""
    if pipe is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    pipe.close()


async def _drain(
    pipe: asyncio.StreamReader | None, into: bytearray, limit: int, over: asyncio.Event
) -> None:
    """Reads to the end, keeping ``limit`` bytes: a pipe nobody reads would block the
    program, and one read after the other could deadlock with it."""
    if pipe is None:
        return
    while chunk := await pipe.read(65536):
        room = limit - len(into)
        into += chunk[: max(room, 0)]
        if len(chunk) > room:
            over.set()
