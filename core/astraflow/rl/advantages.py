"""Group-normalised advantages (torch-free: the data layer stamps them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-5


def group_advantages(rewards: Sequence[float], normalise_std: bool = True) -> list[float]:
    """A = (r - mean_group) / (std_group + eps) for the rewards of one group.

    ``std`` is the population standard deviation. A group whose rewards are all equal
    gets zero advantages (no learning signal).
    """
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    if not normalise_std:
        return [r - mean for r in rewards]
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + EPS) for r in rewards]
