"""The shared contract suites a plugin's tests subclass hold for the built-in options:
a task source, a reward, a trajectory filter, one- and two-policy workflows, loggers."""

from __future__ import annotations

from astraflow.testing.contracts import (
    LoggerContract,
    RewardContract,
    TaskSourceContract,
    TrajectoryFilterContract,
    WorkflowContract,
)
from astraflow.types import Task


class TestArithmeticTasks(TaskSourceContract):
    option = "arithmetic"


class TestFunctionTasks(TaskSourceContract):
    option = "functions"


class TestExactMatch(RewardContract):
    option = "exact_match"
    cases = [(Task("t", "1+1=", "2"), "2", 1.0), (Task("t", "1+1=", "2"), "3", 0.0),
             (Task("t", "1+1=", "2"), " 2 ", 1.0)]


class TestMathReward(RewardContract):
    option = "math"
    cases = [(Task("t", "x?", "4"), "so it is \\boxed{4}", 1.0)]


class TestDynamicSampling(TrajectoryFilterContract):
    option = "dynamic_sampling"


class TestSingleTurn(WorkflowContract):
    option = "single_turn"


class TestSolveVerify(WorkflowContract):
    option = "solve_verify"
    replies = {"solver": "2", "verifier": "yes"}


class TestTensorBoardLogger(LoggerContract):
    option = "tensorboard"


class TestMLflowLogger(LoggerContract):
    option = "mlflow"
