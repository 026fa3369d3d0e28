"""Rollout backend over an SGLang server (GPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class SGLangConfig:
    """Settings of ``raas=sglang``."""

    name: str = "sglang"


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "sglang",
        "astraflow_raas_sglang.backend:SGLangRolloutBackend",
        SGLangConfig,
        description="Rollout backend over an SGLang server (GPU machines).",
    )
