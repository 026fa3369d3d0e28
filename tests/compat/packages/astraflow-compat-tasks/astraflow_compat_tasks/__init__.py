"""A task pack: sums of two small numbers (``task=compat_sums``), a curriculum that rests
the sums the policy has mastered (``data=compat_mastery``) and a reward with partial
credit per digit (``reward=compat_digits``). The implementations are imported only when
a run selects them."""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting
from astraflow.rewards.base import RewardConfig


@dataclass
class SumsConfig:
    """``task=compat_sums``: every ``a+b=`` with ``a, b <= max_operand``, shuffled by
    ``seed``; the first ``num_eval`` are held out, the next ``num_train`` train."""

    name: str = "compat_sums"
    max_operand: int = setting(9, ge=1)
    num_train: int = setting(24, ge=1)
    num_eval: int = setting(8, ge=1)
    seed: int = 0


@dataclass
class MasteryConfig:
    """``data=compat_mastery``: a sum whose last ``patience`` groups were all right is
    issued only every ``revisit_every``-th time it comes round."""

    name: str = "compat_mastery"
    patience: int = setting(2, ge=1)
    revisit_every: int = setting(4, ge=1)
    #: whose groups count; None: every policy's
    policy: str | None = None


@dataclass
class DigitsConfig(RewardConfig):
    """``reward=compat_digits``: 1 for the exact answer, else ``partial`` times the share
    of the answer's digits in their place."""

    name: str = "compat_digits"
    partial: float = setting(0.5, ge=0, le=1)


@hookimpl
def astraflow_register_tasks(register):
    register("compat_sums", "astraflow_compat_tasks.sums:SumTasks", SumsConfig,
             description="Sums of two small numbers, with a held-out split.")


@hookimpl
def astraflow_register_task_selectors(register):
    register("compat_mastery", "astraflow_compat_tasks.mastery:Mastery", MasteryConfig,
             description="Rests the tasks whose recent groups were all right.")


@hookimpl
def astraflow_register_rewards(register):
    register("compat_digits", "astraflow_compat_tasks.digits:Digits", DigitsConfig,
             description="1 for the exact answer, partial credit per digit in place.")
