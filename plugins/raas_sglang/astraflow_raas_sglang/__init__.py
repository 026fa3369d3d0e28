"""Rollout backend over an SGLang server (GPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass, field

from astraflow import hookimpl


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
    port: int = 0  # 0 picks a free port
    server_module: str = "sglang.launch_server"  # or another with its flags, e.g. a router
    mem_fraction_static: float | None = None  # GPU memory SGLang reserves; None: its default
    server_args: list[str] = field(default_factory=list)  # more launch_server flags
    log_dir: str | None = None  # server logs; None: the system temp directory
    startup_timeout: float = 900.0  # seconds for a start or restart to become healthy
    request_timeout: float = 600.0  # seconds for one /generate or weight update
    health_interval: float = 5.0  # seconds between supervision checks
    health_timeout: float = 30.0  # SGLang's /health runs a one-token generation
    max_health_failures: int = 3  # consecutive failed checks before a restart
    max_restarts: int = 3  # restarts before the backend gives up
    pause_mode: str = "retract"  # /pause_generation mode: abort | retract | in_place


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "sglang",
        "astraflow_raas_sglang.backend:SGLangRolloutBackend",
        SGLangConfig,
        description="Rollout backend over an SGLang server (GPU machines).",
    )
