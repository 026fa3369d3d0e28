"""The preloaded parent (``python -m astraflow _preload --fd N``): it imports torch,
transformers and the selected plugins' modules once, and forks each component from
them, so a component starts in milliseconds instead of importing for seconds beside
the others on the same cores (the idea of ``multiprocessing``'s forkserver with
preload, or gunicorn's ``--preload``).

It speaks JSON lines over the socket the launcher handed down (:mod:`.preload` is the
launcher's end), one reply per request, in order:

- ``{"op": "import", "modules": [...]}`` -> ``{"ok": true}``, or ``{"unsafe": WHY}`` when
  forking from here is no longer safe (a thread or an accelerator was started);
- ``{"op": "log", "path": FILE, "previous": FILE}`` -> ``{"ok": true}``: log to FILE
  from now on, with what was written to the previous log first;
- ``{"op": "fork", "args": [...], "env": {...}, "cwd": DIR, "log": FILE}`` ->
  ``{"pid": PID}``: the component ``python -m astraflow ARGS`` as the launcher's own
  child (a double fork: the launcher is a child subreaper), in its own session, its
  output appended to FILE, its command line the one a fresh start would show.

It exits when the launcher closes its end, and dies with the launcher.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, cast

from astraflow.lifecycle import LAUNCHER_ENV

#: how long a forked component waits to be adopted by the launcher before it starts
ADOPTION_TIMEOUT = 5.0


class _Server:
    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.unsafe: str | None = None
        #: torch's default seed, recorded before anything drew from its generator
        self.torch_seed: int | None = None

    def serve(self) -> dict[str, Any] | None:
        """Answer the launcher until it closes the socket (None), or, in a forked
        component, return the request it is to run."""
        reader = self.sock.makefile("rb")
        for line in reader:
            request = json.loads(line)
            if request["op"] == "import":
                reply = self.preload(request["modules"])
            elif request["op"] == "log":
                reply = _move_log(request["previous"], request["path"])
            elif self.unsafe:
                reply = {"error": self.unsafe}
            else:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = _fork(request)
                if "pid" in request:  # the component: leave the server's loop behind
                    reader.close()
                    self.sock.close()
                    return cast(dict[str, Any], request)
                reply = {"pid": pid} if pid else {"error": "fork failed"}
            self.sock.sendall(json.dumps(reply).encode() + b"\n")
        return None

    def preload(self, modules: list[str]) -> dict[str, Any]:
        started = time.monotonic()
        failed = {}
        # an import makes objects by the hundred thousand and no garbage worth a
        # collection: the collector would run over them again and again (~30% of the time)
        gc.disable()
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # the component imports it again and says why
                failed[name] = f"{type(exc).__name__}: {exc}"
            if name == "torch" and self.torch_seed is None and "torch" in sys.modules:
                self.torch_seed = sys.modules["torch"].initial_seed()
        self.unsafe = self.unsafe or _fork_hazard()
        # what was imported stays: out of the collector's reach, its pages stay shared
        # (the little garbage among it too: a collection first would take ~0.5 s)
        gc.freeze()
        gc.enable()
        seconds = round(time.monotonic() - started, 3)
        print(f"preloaded {len(modules)} modules in {seconds} s"
              + (f"; not preloaded: {failed}" if failed else "")
              + (f"; forking is not safe: {self.unsafe}" if self.unsafe else ""), flush=True)
        if self.unsafe:
            return {"unsafe": self.unsafe}
        return {"ok": True, "seconds": seconds, "failed": failed}


def _move_log(previous: str, path: str) -> dict[str, Any]:
    """Log to ``path`` from now on, what was written to ``previous`` first."""
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with open(previous, "rb") as fh:
            os.write(out, fh.read())
        os.unlink(previous)
    except OSError:
        pass
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    return {"ok": True}


def _fork_hazard() -> str | None:
    """Why forking from this process is no longer safe, or None: a thread started (its
    locks could be held at the fork) or an accelerator initialised."""
    threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["?"]
    if len(threads) > 1:
        names = []
        for tid in threads:
            try:
                with open(f"/proc/self/task/{tid}/comm") as fh:
                    names.append(fh.read().strip())
            except OSError:
                names.append(tid)
        return f"the preloaded modules started {len(threads) - 1} thread(s) ({', '.join(names)})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the preloaded modules initialised CUDA"
    return None


def _fork(request: dict[str, Any]) -> int:
    """Fork the component through a go-between that exits at once, so the component is
    adopted by the launcher (a child subreaper): its parent, as in a fresh start.
    Returns the component's pid here (0 if the fork failed), 0 in the component; the
    component knows itself by ``request["pid"]`` being set there."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # the go-between: nothing of the server's loop runs here
        try:
            os.close(read_end)
            pid = os.fork()
            if pid == 0:
                os.close(write_end)
                request["pid"] = os.getpid()
                return 0
            os.write(write_end, str(pid).encode())
        except BaseException:
            os._exit(1)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        said = fh.read()
    os.waitpid(first, 0)
    return int(said or 0)


def become(request: dict[str, Any], torch_seed: int | None) -> list[str]:
    """In a forked component: become what ``python -m astraflow ARGS`` started fresh
    would be; returns ARGS, for the caller to run."""
    args = [str(a) for a in request["args"]]
    try:
        _adopted(int(request["env"].get(LAUNCHER_ENV, "0")))
        os.setsid()  # its own session and process group, as start_new_session gave it
        _redirect(request["log"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [sys.argv[0], *args]
        _title(" ".join([sys.executable, "-m", "astraflow", *args]))
        _reseed(torch_seed)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    return args


def _adopted(launcher: int) -> None:
    """Until the go-between has exited and the launcher adopted this process: the
    component's parent is the launcher, whose death it follows (``end_with_launcher``)."""
    deadline = time.monotonic() + ADOPTION_TIMEOUT
    while launcher and os.getppid() != launcher and time.monotonic() < deadline:
        time.sleep(0.0005)


def _redirect(log: str) -> None:
    """stdin from /dev/null; stdout and stderr appended to the component's log."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)


def _title(title: str | None) -> None:
    """The command line ``ps`` shows (and tests and operators look processes up by);
    None sets it up: it takes over the environment's memory, so it must come first."""
    try:
        import setproctitle
    except ImportError:
        return
    if title is None:
        setproctitle.getproctitle()
    else:
        setproctitle.setproctitle(title)


def _reseed(torch_seed: int | None) -> None:
    """Random generators as a fresh process has them, not copies of the parent's:
    Python's and numpy's from the system's entropy, torch's at its default seed (a fresh
    process's, which the parent recorded before anything drew from it)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and torch_seed is not None:
        torch.manual_seed(torch_seed)
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))


def main(fd: int) -> list[str] | None:
    """``astraflow _preload --fd N``: serve the launcher until it is done (None), or, in
    a forked component, return the command line it is to run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    _title(None)  # before a component replaces the environment it takes room from
    server = _Server(fd)
    request = server.serve()
    if request is None:
        return None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return become(request, server.torch_seed)
