"""The built-in advantage estimators against advantages worked out by hand, and each
through the contract a plugin's estimator passes."""

from __future__ import annotations

import pytest

from astraflow.contracts import AdvantageEstimator
from astraflow.contracts.advantage import has_batch_stage
from astraflow.plugins import get_registry
from astraflow.rl.advantages import EPS, group_advantages
from astraflow.testing.contracts import AdvantageEstimatorContract

NO_FAIL = [False] * 4


def estimator(name: str) -> AdvantageEstimator:
    return get_registry().get("advantage_estimator", name).create(None)


def test_grpo_is_the_group_mean_over_the_population_std():
    # mean 0.5, population std 0.5
    out = estimator("grpo").group_advantages([1.0, 0.0, 1.0, 0.0], failed=NO_FAIL)
    assert out == pytest.approx([0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)] * 2, rel=1e-12)
    # mean 0.25, std sqrt(3)/4
    out = estimator("grpo").group_advantages([1.0, 0.0, 0.0, 0.0], failed=NO_FAIL)
    std = 3 ** 0.5 / 4
    assert out == pytest.approx([0.75 / (std + EPS)] + [-0.25 / (std + EPS)] * 3, rel=1e-12)


def test_grpo_is_exactly_the_advantages_stamped_before_estimators_were_plugins():
    cases = [([1.0, 0.0, 0.0, 0.0], None, None), ([0.3, 0.9, 0.5, 0.1], None, None),
             ([1.0, 1.0, 0.0, 0.5], ["a", "a", "b", "c"], [1.0, 1.0, 0.0, 0.5])]
    for rewards, rollouts, rollout_rewards in cases:
        failed = [False, False, False, True]
        assert estimator("grpo").group_advantages(
            rewards, failed=failed, rollouts=rollouts, rollout_rewards=rollout_rewards
        ) == group_advantages(rewards, failed=failed, rollouts=rollouts,
                              rollout_rewards=rollout_rewards)


def test_dr_grpo_subtracts_the_group_mean_only():
    out = estimator("dr_grpo").group_advantages([1.0, 0.0, 0.0, 0.0], failed=NO_FAIL)
    assert out == [0.75, -0.25, -0.25, -0.25]
    out = estimator("dr_grpo").group_advantages([0.5, 0.25, 9.0], failed=[False, False, True])
    assert out == [0.125, -0.125, 0.0]


def test_rloo_subtracts_the_mean_of_the_other_rewards():
    rloo = estimator("rloo")
    # 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3
    assert rloo.group_advantages([1.0, 0.0, 0.0, 0.0], failed=NO_FAIL) == pytest.approx(
        [1.0, -1 / 3, -1 / 3, -1 / 3], rel=1e-12)
    # 4/3 (r - mean): RLOO's scale is GRPO's times std * n / (n - 1), not unit variance
    assert rloo.group_advantages([1.0, 1.0, 0.0, 0.0], failed=NO_FAIL) == pytest.approx(
        [2 / 3, 2 / 3, -2 / 3, -2 / 3], rel=1e-12)
    # a failed reward is no "other": 1 - 0 and 0 - 1
    assert rloo.group_advantages([1.0, 0.0, 5.0], failed=[False, False, True]) == [
        1.0, -1.0, 0.0]
    # a group of one has no other to compare with
    assert rloo.group_advantages([1.0], failed=[False]) == [0.0]
    assert rloo.group_advantages([1.0, 0.0], failed=[False, True]) == [0.0, 0.0]


def test_rloo_counts_an_agents_rollout_once():
    # rollout a (3 segments, reward 1), b (0), c (0.5): a's baseline is mean(0, 0.5)
    out = estimator("rloo").group_advantages(
        [1.0, 1.0, 1.0, 0.0, 0.5], failed=[False] * 5, rollouts=["a", "a", "a", "b", "c"],
        rollout_rewards=[1.0, 1.0, 1.0, 0.0, 0.5])
    assert out == pytest.approx([0.75, 0.75, 0.75, -0.75, 0.0], abs=1e-12)


def test_reinforce_pp_subtracts_the_group_mean_then_normalises_the_batch():
    rpp = estimator("reinforce_pp")
    a = rpp.group_advantages([1.0, 0.0, 0.0, 0.0], failed=NO_FAIL)
    b = rpp.group_advantages([1.0, 1.0, 0.0, 0.0], failed=NO_FAIL)
    assert a + b == [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]
    # the batch: mean 0, population variance (0.75**2 + 3 * 0.25**2 + 4 * 0.25) / 8
    std = (1.75 / 8) ** 0.5
    out = rpp.batch_advantages([*a, *b, 0.0], failed=[False] * 8 + [True])
    assert out == pytest.approx([x / (std + EPS) for x in a + b] + [0.0], rel=1e-12)
    # the batch's mean is taken out too (groups cut short by failures, replayed samples)
    out = rpp.batch_advantages([1.0, 2.0, 3.0], failed=[False] * 3)
    assert out == pytest.approx([-1 / ((2 / 3) ** 0.5 + EPS), 0.0, 1 / ((2 / 3) ** 0.5 + EPS)])
    assert rpp.batch_advantages([0.5], failed=[False]) == [0.0]


def test_only_reinforce_pp_has_a_batch_stage():
    assert {name: has_batch_stage(estimator(name))
            for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp")} == {
        "grpo": False, "dr_grpo": False, "rloo": False, "reinforce_pp": True}
    advantages = [0.5, -0.5, 0.0]
    assert estimator("grpo").batch_advantages(advantages, failed=[False] * 3) == advantages


class TestGRPOContract(AdvantageEstimatorContract):
    option = "grpo"


class TestDrGRPOContract(AdvantageEstimatorContract):
    option = "dr_grpo"


class TestRLOOContract(AdvantageEstimatorContract):
    option = "rloo"


class TestReinforcePPContract(AdvantageEstimatorContract):
    option = "reinforce_pp"
