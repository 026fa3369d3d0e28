"""``policies.<name>.advantage=fixed_baseline``: REINFORCE with a fixed baseline.

The group stage subtracts a fixed ``baseline`` from each reward (no group statistic);
the batch stage scales the served batch by ``scale``. Both are visible in what a trainer
receives: ``(reward - 0.5) * 0.5`` at the defaults, 0 for a failed reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting
from astraflow.contracts import AdvantageEstimator


@dataclass
class FixedBaselineConfig:
    #: subtracted from every reward (a reward on the 0..1 scale: its middle)
    baseline: float = setting(0.5, ge=0, le=1)
    #: every served advantage is multiplied by it
    scale: float = setting(0.5, gt=0)


class FixedBaseline(AdvantageEstimator):
    """``r - baseline`` at intake, times ``scale`` when served."""

    config: FixedBaselineConfig

    def group_advantages(self, rewards: Sequence[float], *, failed: Sequence[bool],
                         rollouts: Sequence[str | None] | None = None,
                         rollout_rewards: Sequence[float] | None = None) -> list[float]:
        return [0.0 if bad else r - self.config.baseline
                for r, bad in zip(rewards, failed, strict=True)]

    def batch_advantages(self, advantages: Sequence[float], *,
                         failed: Sequence[bool]) -> list[float]:
        return [0.0 if bad else a * self.config.scale
                for a, bad in zip(advantages, failed, strict=True)]


@hookimpl
def astraflow_register_advantage_estimators(register):
    register("fixed_baseline", FixedBaseline, FixedBaselineConfig,
             description="REINFORCE with a fixed baseline: (r - baseline) * scale.")
