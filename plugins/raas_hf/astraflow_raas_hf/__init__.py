"""Rollout backend over Hugging Face transformers (CPU or GPU).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class HFConfig:
    """Settings of ``raas=hf``."""

    name: str = "hf"
    dtype: str = "float32"  # float32 | bfloat16
    max_batch_size: int = 256  # sequences per forward pass (after expanding n)
    num_threads: int = 1  # torch intra-op threads of this engine
    device: str = "auto"  # auto (the first CUDA device if any, else cpu) | cpu | cuda[:N]


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "hf",
        "astraflow_raas_hf.backend:HFRolloutBackend",
        HFConfig,
        description="Rollout backend over Hugging Face transformers (CPU or GPU).",
    )
