"""Trainer backend over Hugging Face transformers and torch.

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.rl.options import PolicyGradientOptions


@dataclass
class HFConfig(PolicyGradientOptions):
    """Settings of ``trainer=hf``: the shared optimisation settings, and the device.

    ``device``: ``auto`` trains on the first CUDA device when there is one, else on the
    CPU; or ``cpu``, ``cuda``, ``cuda:N``. With ``world_size`` > 1 each rank takes its
    own device (``LOCAL_RANK``) and the model is sharded with FSDP2 (one unit per
    decoder layer, and the rest).

    ``mixed_precision``: ``bfloat16`` computes in bfloat16 while the master weights,
    optimiser and gradient reductions stay in ``dtype``; ``none`` computes in ``dtype``.
    ``activation_checkpointing`` recomputes each decoder layer's activations in the
    backward pass instead of keeping them. ``cpu_offload`` keeps the sharded parameters,
    gradients and optimiser state in CPU memory and steps the optimiser there (FSDP2,
    GPUs). ``reshard_after_forward`` frees gathered parameters after each layer's
    forward (less memory, one more gather in the backward pass).
    """

    name: str = "hf"
    device: str = "auto"
    mixed_precision: str = "none"
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool = True


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "hf",
        "astraflow_trainer_hf.backend:HFTrainerBackend",
        HFConfig,
        description="Trainer backend over Hugging Face transformers and torch.",
    )
