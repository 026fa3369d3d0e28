"""GRESO selective rollout (before-rollout data algorithm).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass
from typing import Any

from astraflow import hookimpl
from astraflow.config import setting


@dataclass
class GresoConfig:
    """Settings of ``data=greso`` (defaults from the GRESO paper).

    A task whose last ``z`` groups all had zero reward variance is issued with
    probability ``max(p_kind ** z, floor_kind)``; ``p_kind`` adapts on every new policy
    version so that about ``alpha_kind`` of the rollouts are zero-variance of that kind.
    """

    name: str = "greso"
    policy: str | None = None  # whose rewards drive selection; None: every policy's
    p_init: float = setting(0.5, ge=0, le=1)
    floor_easy: float = setting(0.10, ge=0, le=1)
    floor_hard: float = setting(0.40, ge=0, le=1)
    alpha_easy: float = setting(0.083, ge=0, le=1)
    alpha_hard: float = setting(0.167, ge=0, le=1)
    #: the step of ``p_kind`` at each new policy version (0: it stays at ``p_init``)
    adjust: float = setting(0.01, ge=0, le=1)
    p_min: float = setting(0.01, ge=0, le=1)
    p_max: float = setting(0.99, ge=0, le=1)
    #: mean reward above this makes a zero-variance group easy; on the reward's own
    #: scale, so declared without a range
    easy_threshold: float = setting(0.5, why="a mean reward, on the reward's own scale")
    seed: int = setting(0, ge=0)

    @staticmethod
    def relations(greso: Any) -> list[str]:
        """``p_kind`` is kept between ``p_min`` and ``p_max``."""
        if greso.p_min <= greso.p_max:
            return []
        return [f"data.greso.p_min={greso.p_min} must be <= data.greso.p_max={greso.p_max}"]


@hookimpl
def astraflow_register_task_selectors(register):
    register(
        "greso",
        "astraflow_data_greso.greso:Greso",
        GresoConfig,
        description="GRESO selective rollout (before-rollout data algorithm).",
    )
