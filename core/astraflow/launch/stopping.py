"""A stop that ends: once the launcher starts stopping a run, it returns within a bound.

Each component gets SIGTERM, then SIGKILL (:meth:`LocalRun.stop`); a process the kernel
cannot end at once (stuck in uninterruptible I/O) or a launcher stuck elsewhere would still
keep a user's Ctrl-C waiting. :class:`StopDeadline` watches the stop from a thread: past its
deadline it says on the console where the launcher is (every thread's stack), kills what
is left of each component's process group and ends the launcher.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, ``timeout``, a batch scheduler) stops the run as Ctrl-C does.
    Python's default would end the launcher alone: its components would get SIGTERM
    from the kernel all at once, and nodes would wait minutes for the data layer that
    just went away to take their leases back."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``D``, ``Z`` ...), or
    ``gone``: a process in ``D`` cannot take SIGKILL until its I/O returns."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[-1].split()[0]


def kill_groups(pids: Iterable[int]) -> None:
    """SIGKILL each process and its process group (a component is the leader of its own
    session, so its engine's helpers go with it)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class StopDeadline:
    """``with StopDeadline(pids, seconds):`` around a stop. ``pids`` is asked at the
    deadline (name -> pid of what may be left); the launcher then exits with ``code``."""

    def __init__(self, pids: Callable[[], dict[str, int]], seconds: float = 90.0,
                 code: int = 130) -> None:
        self.pids, self.seconds, self.code = pids, seconds, code
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="stop-deadline", daemon=True)

    def __enter__(self) -> StopDeadline:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()

    def _watch(self) -> None:
        if self.done.wait(self.seconds):
            return
        left = self.pids()
        states = ", ".join(f"{name} (pid {pid}, state {process_state(pid)})"
                           for name, pid in left.items()) or "none"
        print(f"astraflow: stopping took over {self.seconds:g} s; killing what is left and "
              f"ending; the components: {states}; where the launcher was:", file=sys.stderr)
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        kill_groups(left.values())
        sys.stderr.flush()
        os._exit(self.code)
