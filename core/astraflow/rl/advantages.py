"""Advantages from rewards (torch-free: the data layer stamps them).

:func:`group_advantages` is GRPO's group normalisation; the built-in advantage
estimators (:class:`~astraflow.contracts.AdvantageEstimator`, selected per policy with
``policies.<name>.advantage``) are defined here too:

* ``grpo`` -- ``(r - mean) / (std + eps)`` over the group (DeepSeekMath, 2024);
* ``dr_grpo`` -- ``r - mean``: no division by the group's std, which weighs groups
  whose rewards barely differ up (Dr. GRPO, Liu et al. 2025);
* ``rloo`` -- ``r_i - mean_{j != i} r_j``, the leave-one-out baseline (Ahmadian et al.
  2024), that is ``n / (n - 1) * (r_i - mean)``; a group of one gets 0;
* ``reinforce_pp`` -- REINFORCE++ with baseline (Hu et al. 2025): the group mean is
  subtracted at intake, then the served batch's advantages are normalised,
  ``(a - mean_batch) / (std_batch + eps)``.

Every statistic is the population one, leaves failed rewards out (their samples get 0)
and counts an agent's rollout once however many samples (segments) it yielded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from astraflow.contracts.advantage import AdvantageEstimator

EPS = 1e-5


def _counted(rewards: Sequence[float], failed: Sequence[bool],
             rollouts: Sequence[str | None] | None,
             rollout_rewards: Sequence[float] | None) -> tuple[list[float], list[float | None]]:
    """The rewards a group's statistics count, each rollout once (in order of first
    appearance), and per sample the counted value that stands for it (its rollout's;
    None for a failed sample)."""
    if rollouts is None:
        stand = [None if bad else float(r) for r, bad in zip(rewards, failed, strict=True)]
        return [r for r in stand if r is not None], stand
    base = list(rollout_rewards) if rollout_rewards is not None else list(rewards)
    names = [name if name is not None else f"#{i}" for i, name in enumerate(rollouts)]
    first: dict[str, float] = {}
    for i, (name, bad) in enumerate(zip(names, failed, strict=True)):
        if not bad:
            first.setdefault(name, base[i])
    stand_of = [None if bad else first[name] for name, bad in zip(names, failed, strict=True)]
    return list(first.values()), stand_of


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation of a non-empty sequence."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n)


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
    ``normalise_std=False`` leaves out the division by the std (Dr. GRPO).
    """
    failed = list(failed) if failed is not None else [False] * len(rewards)
    scored, _ = _counted(rewards, failed, rollouts, rollout_rewards)
    if not scored:
        return [0.0] * len(rewards)
    mean, std = _mean_std(scored)
    scale = 1.0 / (std + EPS) if normalise_std else 1.0
    return [0.0 if bad else (r - mean) * scale for r, bad in zip(rewards, failed, strict=True)]


def leave_one_out_advantages(rewards: Sequence[float], failed: Sequence[bool],
                             rollouts: Sequence[str | None] | None = None,
                             rollout_rewards: Sequence[float] | None = None) -> list[float]:
    """A_i = r_i - (mean of the other rollouts' rewards), RLOO's baseline: each sample
    is compared with the others only, so the baseline does not depend on its own reward
    (an unbiased estimate). A group with fewer than two rewards counted gets 0."""
    scored, stand = _counted(rewards, failed, rollouts, rollout_rewards)
    n = len(scored)
    if n < 2:
        return [0.0] * len(rewards)
    total = sum(scored)
    return [0.0 if own is None else r - (total - own) / (n - 1)
            for r, own in zip(rewards, stand, strict=True)]


def batch_normalised(advantages: Sequence[float], failed: Sequence[bool]) -> list[float]:
    """(a - mean) / (std + eps) over the samples of a batch whose reward did not fail
    (theirs stays 0); the population std."""
    kept = [a for a, bad in zip(advantages, failed, strict=True) if not bad]
    if not kept:
        return [0.0] * len(advantages)
    mean, std = _mean_std(kept)
    return [0.0 if bad else (a - mean) / (std + EPS)
            for a, bad in zip(advantages, failed, strict=True)]


class GRPO(AdvantageEstimator):
    """``grpo``: ``(r - mean) / (std + eps)`` over the group (the default)."""

    def group_advantages(self, rewards: Sequence[float], *, failed: Sequence[bool],
                         rollouts: Sequence[str | None] | None = None,
                         rollout_rewards: Sequence[float] | None = None) -> list[float]:
        return group_advantages(rewards, failed=failed, rollouts=rollouts,
                                rollout_rewards=rollout_rewards)


class DrGRPO(AdvantageEstimator):
    """``dr_grpo``: ``r - mean`` over the group, without GRPO's division by the std."""

    def group_advantages(self, rewards: Sequence[float], *, failed: Sequence[bool],
                         rollouts: Sequence[str | None] | None = None,
                         rollout_rewards: Sequence[float] | None = None) -> list[float]:
        return group_advantages(rewards, normalise_std=False, failed=failed,
                                rollouts=rollouts, rollout_rewards=rollout_rewards)


class RLOO(AdvantageEstimator):
    """``rloo``: ``r_i - mean_{j != i} r_j`` (:func:`leave_one_out_advantages`)."""

    def group_advantages(self, rewards: Sequence[float], *, failed: Sequence[bool],
                         rollouts: Sequence[str | None] | None = None,
                         rollout_rewards: Sequence[float] | None = None) -> list[float]:
        return leave_one_out_advantages(rewards, failed, rollouts, rollout_rewards)


class ReinforcePlusPlus(AdvantageEstimator):
    """``reinforce_pp``: REINFORCE++ with baseline, ``r - mean`` over the group at
    intake, then normalised over the served batch (:func:`batch_normalised`).

    verl whitens the same advantages over the batch's response tokens (a long response
    weighs more); here each sample counts once, as a sample's advantage is one number.
    """

    def group_advantages(self, rewards: Sequence[float], *, failed: Sequence[bool],
                         rollouts: Sequence[str | None] | None = None,
                         rollout_rewards: Sequence[float] | None = None) -> list[float]:
        return group_advantages(rewards, normalise_std=False, failed=failed,
                                rollouts=rollouts, rollout_rewards=rollout_rewards)

    def batch_advantages(self, advantages: Sequence[float], *,
                         failed: Sequence[bool]) -> list[float]:
        return batch_normalised(advantages, failed)
