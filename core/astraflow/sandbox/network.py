"""Which network mode, and which layers, hold where the sandbox runs: a probe program
tells, run once per mode and process.

In ``namespace`` mode the program gets fresh user, network and PID namespaces, where the
kernel allows them: no interface but a downed loopback. In ``refuse`` mode the
interpreter's audit hook refuses sockets and name lookups. ``auto`` takes the first
where it works.
"""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.sandbox.child import LAYERS_ENV
from astraflow.sandbox.config import SandboxConfig
from astraflow.sandbox.process import execute, run_in_new_loop
from astraflow.sandbox.result import SandboxResult

#: the probe program: prints the layers the child put in force
_PROBE = f"import os\nprint(os.environ.get({LAYERS_ENV!r}, ''))\n"
#: seconds the probe may take, whatever the config's timeout
_PROBE_TIMEOUT = 30.0
#: the probe's result by mode, the first of this process
_probed: dict[str, SandboxResult] = {}
_probe_lock = threading.Lock()


def choose_network(config: SandboxConfig, cgroup_parent: Path | None) -> str:
    """The network mode runs take for ``config.network``: a sandbox that cannot confine
    anything fails here, in one line, not on every sample later."""
    wanted = config.network
    if wanted in ("auto", "namespace"):
        result = probe(config, "namespace", cgroup_parent)
        if result.ok:
            return "namespace"
        if wanted == "namespace":
            raise RuntimeError(
                f"sandbox network='namespace' is not available here "
                f"({_last_line(result.stderr)}); use network='refuse'"
            )
    result = probe(config, "refuse", cgroup_parent)
    if not result.ok:
        raise RuntimeError(f"the sandbox cannot run programs here: {_last_line(result.stderr)}")
    return "refuse"


def layers_in_force(
    config: SandboxConfig, network: str, cgroup_parent: Path | None
) -> tuple[str, ...]:
    """The layers (:mod:`astraflow.sandbox`) a run in mode ``network`` puts in force."""
    told = probe(config, network, cgroup_parent).stdout.strip().split(",")
    return tuple(filter(None, told))


def probe(config: SandboxConfig, network: str, cgroup_parent: Path | None) -> SandboxResult:
    """The probe program's run in mode ``network``: run on the first call for that mode
    in this process (with that caller's ``config``), remembered after it."""
    with _probe_lock:
        if network not in _probed:
            _probed[network] = run_in_new_loop(
                execute(config, _PROBE, "", None, _PROBE_TIMEOUT, network, cgroup_parent)
            )
        return _probed[network]


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1]
