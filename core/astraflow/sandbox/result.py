"""How a sandboxed run ended: :class:`SandboxResult`, and the status an exit code
stands for."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from astraflow.sandbox.child import MEMORY_EXIT, SETUP_FAILED


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


def status_of(returncode: int) -> str:
    """The status of a run whose child exited with ``returncode`` by itself (neither at
    the timeout nor over the output limit)."""
    if returncode == 0:
        return "ok"
    if returncode == SETUP_FAILED:
        return "sandbox_error"
    if returncode in (MEMORY_EXIT, -signal.SIGKILL):  # an unexplained SIGKILL: OOM killer
        return "memory"
    if returncode == -signal.SIGXCPU:
        return "timeout"
    return "error"
