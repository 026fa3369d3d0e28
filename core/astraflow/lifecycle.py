"""How a component the local launcher started lives and dies with it.

Kept apart from the launcher so that components (nodes, trainers, evaluators) import
these few functions without importing the launcher.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

#: the launcher's pid, in the environment of the components it starts
LAUNCHER_ENV = "ASTRAFLOW_LAUNCHER_PID"
#: where a component the launcher started marks that it got to work
READY_ENV = "ASTRAFLOW_READY_FILE"
#: the pid of the launcher this component ends with (:func:`end_with_launcher`)
_launcher: int | None = None


def mark_ready() -> None:
    """In a component the launcher started: say that set-up is over and work has begun
    (a node registered, a trainer published its first version, an evaluator scored the
    start weights). From then on a crash is worth a restart."""
    path = os.environ.get(READY_ENV)
    if path:
        Path(path).touch()


def end_with_launcher() -> None:
    """In a component the launcher started: SIGTERM when the launcher dies, however it
    dies (a SIGKILL included), so that no component outlives its run. Done by the
    component itself at start-up, not between fork and exec, where the launcher's other
    threads may hold locks that the call would need."""
    global _launcher
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if launcher is None:
        return
    _launcher = int(launcher)
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(launcher):  # it died before the request took effect
        sys.exit("astraflow: the launcher that started this component has exited")


def launcher_gone() -> bool:
    """In a component that ends with its launcher: the launcher has died (this process
    was handed to another parent), so every component of the run is ending with it."""
    return _launcher is not None and os.getppid() != _launcher
