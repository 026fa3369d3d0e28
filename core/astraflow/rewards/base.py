"""What every reward option shares, and how a node scores samples without ever dying.

:class:`Score`, :func:`as_score` and :class:`RewardRunner` are the workflow contract's
(:mod:`astraflow.contracts.reward`), and importable from here as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.contracts.reward import RewardRunner, Score, as_score
from astraflow.schema import setting
from astraflow.types import LEGACY_FAILED as FAILED
from astraflow.types import LEGACY_METRICS as METRICS
from astraflow.types import LEGACY_REASON as ERROR
from astraflow.types import RewardOutcome

__all__ = ["ERROR", "FAILED", "METRICS", "RewardConfig", "RewardRunner", "Score", "as_score",
           "reward_metric_means"]


@dataclass
class RewardConfig:
    """Settings every reward option shares."""

    name: str = "exact_match"
    #: seconds per sample; slower scores the sample as failed
    timeout: float = setting(10.0, gt=0)
    #: the run stops once more of the samples produced than this failed their reward
    #: (1: never)
    max_failure_fraction: float = setting(0.25, ge=0, le=1)


def reward_metric_means(outcomes: list[RewardOutcome]) -> dict[str, float]:
    """``reward/<name>``: the batch mean of each extra metric the reward returned."""
    sums: dict[str, list[float]] = {}
    for outcome in outcomes:
        for key, value in outcome.metrics.items():
            sums.setdefault(f"reward/{key}", []).append(float(value))
    return {key: sum(values) / len(values) for key, values in sorted(sums.items())}
