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
    CPU; or ``cpu``, ``cuda``, ``cuda:N``.
    """

    name: str = "hf"
    device: str = "auto"


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "hf",
        "astraflow_trainer_hf.backend:HFTrainerBackend",
        HFConfig,
        description="Trainer backend over Hugging Face transformers and torch.",
    )
