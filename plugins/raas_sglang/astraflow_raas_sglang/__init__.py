"""Rollout backend over an SGLang server (GPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass, field

from astraflow import hookimpl
from astraflow.config import setting

#: ``/pause_generation`` modes
PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass
class SGLangConfig:
    """Settings of ``raas=sglang``.

    By default the backend starts ``python -m sglang.launch_server`` on the node's model
    and supervises it; with ``url`` it attaches to a server someone else runs. Weight
    refreshes send the server a local directory, so an attached server must see the
    node's files (same machine or a shared file system).
    """

    name: str = "sglang"
    url: str | None = None  # attach to this running server instead of starting one
    host: str = "127.0.0.1"
    port: int = setting(0, ge=0, le=65535)  # 0 picks a free port
    server_module: str = "sglang.launch_server"  # or another with its flags, e.g. a router
    #: GPU memory SGLang reserves; None: its default
    mem_fraction_static: float | None = setting(None, gt=0, le=1)
    server_args: list[str] = field(default_factory=list)  # more launch_server flags
    log_dir: str | None = None  # server logs; None: the system temp directory
    #: seconds for a start or restart to become healthy
    startup_timeout: float = setting(900.0, gt=0)
    #: seconds for one /generate or weight update
    request_timeout: float = setting(600.0, gt=0)
    health_interval: float = setting(5.0, gt=0)  # seconds between supervision checks
    #: SGLang's /health runs a one-token generation
    health_timeout: float = setting(30.0, gt=0)
    #: consecutive failed checks before a restart
    max_health_failures: int = setting(3, ge=1)
    max_restarts: int = setting(3, ge=0)  # restarts before the backend gives up
    pause_mode: str = setting("retract", choices=PAUSE_MODES)  # /pause_generation mode


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "sglang",
        "astraflow_raas_sglang.backend:SGLangRolloutBackend",
        SGLangConfig,
        description="Rollout backend over an SGLang server (GPU machines).",
    )
