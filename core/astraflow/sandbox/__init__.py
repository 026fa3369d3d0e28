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

The package's modules:

- :mod:`~astraflow.sandbox.config`: :class:`SandboxConfig`, the limits of a run;
- :mod:`~astraflow.sandbox.runner`: :class:`Sandbox`, which runs programs
  ``concurrency`` at a time;
- :mod:`~astraflow.sandbox.process`: one run -- its private directory, the child
  process, its pipes, the timeout, the kill and the clean-up;
- :mod:`~astraflow.sandbox.result`: :class:`SandboxResult`, and the status an exit
  code stands for;
- :mod:`~astraflow.sandbox.network`: the probe that chooses the network mode and tells
  the layers in force;
- :mod:`~astraflow.sandbox.cgroups`: a run's pids cgroup, and the kill of every process
  of a run;
- :mod:`~astraflow.sandbox.child`: the child's half, which confines itself and runs the
  program. It runs as a script (``python -I child.py``) and imports the standard library
  only; the parent imports asyncio only inside the functions that use it.
"""

from __future__ import annotations

from astraflow.sandbox.child import LAYERS_ENV, MEMORY_EXIT, SETUP_FAILED
from astraflow.sandbox.config import NETWORK_MODES, SandboxConfig
from astraflow.sandbox.result import SandboxResult
from astraflow.sandbox.runner import Sandbox

__all__ = [
    "LAYERS_ENV",
    "MEMORY_EXIT",
    "NETWORK_MODES",
    "SETUP_FAILED",
    "Sandbox",
    "SandboxConfig",
    "SandboxResult",
]
