"""GRESO selective rollout (before-rollout data algorithm).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class GresoConfig:
    """Settings of ``data=greso`` (defaults from the GRESO paper).

    A task whose last ``z`` groups all had zero reward variance is issued with
    probability ``max(p_kind ** z, floor_kind)``; ``p_kind`` adapts on every new policy
    version so that about ``alpha_kind`` of the rollouts are zero-variance of that kind.
    """

    name: str = "greso"
    policy: str | None = None  # whose rewards drive selection; None: every policy's
    p_init: float = 0.5
    floor_easy: float = 0.10
    floor_hard: float = 0.40
    alpha_easy: float = 0.083
    alpha_hard: float = 0.167
    adjust: float = 0.01
    p_min: float = 0.01
    p_max: float = 0.99
    easy_threshold: float = 0.5  # mean reward above this makes a zero-variance group easy
    seed: int = 0


@hookimpl
def astraflow_register_task_selectors(register):
    register(
        "greso",
        "astraflow_data_greso.greso:Greso",
        GresoConfig,
        description="GRESO selective rollout (before-rollout data algorithm).",
    )
