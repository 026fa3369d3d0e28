"""Trainer backend over Megatron-core (CPU mode when CUDA is absent).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.rl.options import PolicyGradientOptions


@dataclass
class MegatronConfig(PolicyGradientOptions):
    """Settings of ``trainer=megatron``: the shared optimisation settings, plus the
    parallel sizes. ``tensor_model_parallel_size`` applies on CUDA GPUs under
    ``torchrun``; without CUDA the backend runs at world size 1 (CPU mode).
    """

    name: str = "megatron"
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "megatron",
        "astraflow_trainer_megatron.backend:MegatronTrainerBackend",
        MegatronConfig,
        description="Trainer backend over Megatron-core (CPU mode when CUDA is absent).",
    )
