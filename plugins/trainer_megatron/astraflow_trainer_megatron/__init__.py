"""Trainer backend over Megatron-core (CPU mode when CUDA is absent).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class MegatronConfig:
    """Settings of ``trainer=megatron``."""

    name: str = "megatron"


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "megatron",
        "astraflow_trainer_megatron.backend:MegatronTrainerBackend",
        MegatronConfig,
        description="Trainer backend over Megatron-core (CPU mode when CUDA is absent).",
    )
