"""Group-normalised advantages (torch-free: the data layer stamps them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-5


def group_advantages(rewards: Sequence[float], normalise_std: bool = True,
                     failed: Sequence[bool] | None = None) -> list[float]:
    """A = (r - mean_group) / (std_group + eps) for the rewards of one group.

    ``std`` is the population standard deviation. A group whose rewards are all equal
    gets zero advantages (no learning signal). Samples whose reward ``failed`` (raised or
    timed out) carry no judgement: they are left out of the mean and std and get zero
    advantage, so a broken reward neither rewards nor punishes anything.
    """
    failed = list(failed) if failed is not None else [False] * len(rewards)
    scored = [r for r, bad in zip(rewards, failed, strict=True) if not bad]
    n = len(scored)
    if n == 0:
        return [0.0] * len(rewards)
    mean = sum(scored) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / n)
    scale = 1.0 / (std + EPS) if normalise_std else 1.0
    return [0.0 if bad else (r - mean) * scale for r, bad in zip(rewards, failed, strict=True)]
