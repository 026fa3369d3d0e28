"""Group-normalised advantages (torch-free: the data layer stamps them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-5


def group_advantages(rewards: Sequence[float], normalise_std: bool = True,
                     failed: Sequence[bool] | None = None,
                     rollouts: Sequence[str | None] | None = None,
                     rollout_rewards: Sequence[float] | None = None) -> list[float]:
    """A = (r - mean_group) / (std_group + eps) for the rewards of one group.

    ``std`` is the population standard deviation. A group whose rewards are all equal
    gets zero advantages (no learning signal). Samples whose reward ``failed`` (raised or
    timed out) carry no judgement: they are left out of the mean and std and get zero
    advantage, so a broken reward neither rewards nor punishes anything.

    ``rollouts`` names the rollout of each sample when one rollout yields several (an
    agent's segments): the mean and std are then taken over rollouts, each counted once
    with its ``rollout_rewards`` entry (default: its first sample's reward), so a rollout
    that made more calls does not weigh more in its group's baseline.
    """
    failed = list(failed) if failed is not None else [False] * len(rewards)
    if rollouts is not None:
        base = list(rollout_rewards) if rollout_rewards is not None else list(rewards)
        first: dict[str, float] = {}
        for i, (name, bad) in enumerate(zip(rollouts, failed, strict=True)):
            if not bad:
                first.setdefault(name if name is not None else f"#{i}", base[i])
        scored = list(first.values())
    else:
        scored = [r for r, bad in zip(rewards, failed, strict=True) if not bad]
    n = len(scored)
    if n == 0:
        return [0.0] * len(rewards)
    mean = sum(scored) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / n)
    scale = 1.0 / (std + EPS) if normalise_std else 1.0
    return [0.0 if bad else (r - mean) * scale for r, bad in zip(rewards, failed, strict=True)]
