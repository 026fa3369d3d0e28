"""Trainer backend over Megatron-core (CPU mode when CUDA is absent).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.rl.options import PolicyGradientOptions, check_policy_gradient, lora_rank


@dataclass
class MegatronConfig(PolicyGradientOptions):
    """Settings of ``trainer=megatron``: the shared optimisation and parallel settings.

    ``world_size`` ranks split into tensor-parallel groups of
    ``tensor_model_parallel_size``, ``pipeline_model_parallel_size`` stages of equal
    numbers of layers, and data-parallel replicas; on CUDA GPUs with NCCL, without CUDA
    on CPUs with gloo.
    """

    name: str = "megatron"



def check_config(config) -> None:
    """``trainer=megatron``'s settings judged without importing torch or Megatron-core
    (the launcher's pre-flight and the backend both call it)."""
    check_policy_gradient(config)
    if lora_rank(config):
        # Megatron-core has no adapter layers of its own; tensor-parallel adapters
        # would need sharded A/B matrices beside every Column/RowParallelLinear
        raise ValueError("trainer.lora.rank > 0: trainer=megatron trains whole models "
                         "only; train LoRA adapters with trainer=hf (peft)")


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "megatron",
        "astraflow_trainer_megatron.backend:MegatronTrainerBackend",
        MegatronConfig,
        description="Trainer backend over Megatron-core (CPU mode when CUDA is absent).",
        check=check_config,
    )
