"""The limits of sandboxed runs: :class:`SandboxConfig`, a workflow's or a reward's
``sandbox`` settings."""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.schema import setting

#: where the network is kept out: ``namespace`` (a fresh network namespace), ``refuse``
#: (the interpreter refuses sockets), ``auto`` (namespace where the kernel allows one,
#: else refuse)
NETWORK_MODES = ("auto", "namespace", "refuse")


@dataclass
class SandboxConfig:
    """Limits of one run. ``network``: ``namespace`` (a fresh network namespace),
    ``refuse`` (the interpreter refuses sockets), ``auto`` (namespace where the kernel
    allows one, else refuse)."""

    #: wall-clock seconds per run; the whole process group is killed
    timeout: float = setting(5.0, gt=0)
    #: address space (RLIMIT_AS) of each process
    memory_mb: int = setting(512, ge=1)
    #: processes and threads at once: a fork bomb fails to fork
    max_processes: int = setting(32, ge=1)
    #: stdout and stderr each; beyond it the run is killed
    max_output_bytes: int = setting(65536, ge=1)
    #: runs at once per Sandbox; the others wait
    concurrency: int = setting(4, ge=1)
    network: str = setting("auto", choices=NETWORK_MODES)
    #: RLIMIT_CPU
    cpu_seconds: int = setting(0, ge=0, why="0: the timeout plus one second")
    #: largest file the program may write (RLIMIT_FSIZE)
    max_file_mb: int = setting(64, ge=1)
