"""The estimator passes the contract every advantage estimator passes."""

from astraflow.testing.contracts import AdvantageEstimatorContract


class TestFixedBaseline(AdvantageEstimatorContract):
    option = "fixed_baseline"
    #: a fixed baseline is no group's mean: equal rewards keep their distance to it
    equal_rewards_give_zero = False
