"""``trainer=compat_trainer``: AstraFlow's policy-gradient step on a Hugging Face causal LM
with AdamW on the CPU. The backend is imported only when a run selects it."""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.rl.options import PolicyGradientOptions


@dataclass
class CompatTrainerConfig(PolicyGradientOptions):
    """Settings of ``trainer=compat_trainer``: the shared policy-gradient options."""

    name: str = "compat_trainer"


@hookimpl
def astraflow_register_trainer_backends(register):
    register("compat_trainer", "astraflow_compat_trainer.trainer:CompatTrainer",
             CompatTrainerConfig,
             description="AstraFlow's policy gradient on a transformers model, on the CPU.")
