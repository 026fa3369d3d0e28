"""Trainer backend over Megatron-core (CPU mode when CUDA is absent).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class MegatronConfig:
    """Settings of ``trainer=megatron``.

    The optimisation settings mean what they mean for ``trainer=hf``, so the two
    backends train the same policy from the same batches. ``dtype`` is the dtype of
    the Megatron parameters (float32 keeps small AdamW updates that bfloat16 would
    round away); ``export_dtype`` is what rollout engines load.
    ``tensor_model_parallel_size`` applies on CUDA GPUs under ``torchrun``; without
    CUDA the backend runs at world size 1 (CPU mode). ``num_threads`` sets torch's
    intra-op threads (0 leaves torch's default).
    """

    name: str = "megatron"
    lr: float = 2e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    micro_batch_size: int = 64
    dtype: str = "float32"
    export_dtype: str = "bfloat16"
    loss: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    m2po_tau: float = 0.01
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    num_threads: int = 0
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
