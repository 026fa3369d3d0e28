"""Built-in data algorithms."""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.contracts import TrajectoryFilter
from astraflow.schema import setting
from astraflow.types import Trajectory


@dataclass
class DynamicSamplingConfig:
    """``data=dynamic_sampling``: drop groups whose rewards are all equal."""

    name: str = "dynamic_sampling"
    #: rewards closer than this count as equal
    tolerance: float = setting(0.0, ge=0)


class DynamicSampling(TrajectoryFilter):
    """A group with equal rewards has zero advantage everywhere: no learning signal."""

    def keep(self, group: list[Trajectory]) -> bool:
        if len(group) < 2:
            return False
        tol = self.config.tolerance if self.config is not None else 0.0
        rewards = [t.reward for t in group]
        return max(rewards) - min(rewards) > tol
