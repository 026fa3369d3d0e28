"""Advantage estimators: how the rewards of a group become one advantage per sample.

The data layer calls an estimator at two points, both torch-free:

* the **group stage**, at intake, once per completed group of one policy: the group's
  rewards in, one advantage per sample out. The result is stored with each sample, so
  a replayed sample keeps it.
* the **batch stage**, when a batch is served: the group-stage advantages of the batch's
  samples (fresh and replayed, in serving order) in, the advantages the trainer gets
  out. The default leaves them as they are; an estimator that normalises over the batch
  (REINFORCE++) overrides it. The data layer records what it served, so a batch served
  again (fetched ahead and asked for again, or after a restart of either side) carries
  the same advantages.

A policy selects its estimator with ``policies.<name>.advantage=NAME``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


class AdvantageEstimator(ABC):
    """One advantage per sample from the rewards of its group (and, optionally, batch).

    Both stages must be deterministic: the same input gives the same output, in any
    process. A sample whose reward ``failed`` (raised or timed out) carries no
    judgement: it is left out of every statistic and gets advantage 0, at both stages.
    """

    def __init__(self, config: Any = None) -> None:
        """``config``: an instance of the ``config_cls`` the estimator was registered
        with, at its defaults (None if it registered none)."""
        self.config = config

    @abstractmethod
    def group_advantages(self, rewards: Sequence[float], *, failed: Sequence[bool],
                         rollouts: Sequence[str | None] | None = None,
                         rollout_rewards: Sequence[float] | None = None) -> list[float]:
        """One advantage per entry of ``rewards`` (one group of one policy).

        ``failed[i]``: sample ``i``'s reward failed; its advantage must be 0 and its
        reward must not count. ``rollouts`` (None unless a rollout yielded several
        samples, an agent's segments) names each sample's rollout: a group's statistics
        then count each rollout once, with its ``rollout_rewards`` entry (that of its
        first sample), so a rollout that made more calls does not weigh more.
        """

    def batch_advantages(self, advantages: Sequence[float], *,
                         failed: Sequence[bool]) -> list[float]:
        """The advantages a trainer gets for a served batch: ``advantages`` are the
        group-stage ones of its samples in serving order, ``failed`` as above (their
        advantage stays 0). The default returns them unchanged."""
        return list(advantages)


def has_batch_stage(estimator: AdvantageEstimator) -> bool:
    """Whether ``estimator`` overrides the batch stage (the data layer skips decoding
    a served batch for the ones that do not)."""
    return (type(estimator).batch_advantages
            is not AdvantageEstimator.batch_advantages)
