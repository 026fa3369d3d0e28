"""Trainer backend over Hugging Face transformers and torch.

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class HFConfig:
    """Settings of ``trainer=hf``."""

    name: str = "hf"


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "hf",
        "astraflow_trainer_hf.backend:HFTrainerBackend",
        HFConfig,
        description="Trainer backend over Hugging Face transformers and torch.",
    )
