"""The shared contract suites a plugin's tests subclass hold for the built-in options:
task sources, rewards, a trajectory filter, one- and two-policy workflows, a logger
(MLflow's, whose library starts a process, is in tests/system/loggers)."""

from __future__ import annotations

from astraflow.testing.contracts import (
    LoggerContract,
    RewardContract,
    TaskSourceContract,
    TrajectoryFilterContract,
    WorkflowContract,
)
from astraflow.types import Task

ADD = Task("t", "1+1=", "2")
#: (contract, option, what the suite is told of it): a test class each
SUITES = [
    (TaskSourceContract, "arithmetic", {}),
    (TaskSourceContract, "functions", {}),
    (RewardContract, "exact_match", {"cases": [(ADD, "2", 1.0), (ADD, "3", 0.0),
                                               (ADD, " 2 ", 1.0)]}),
    (RewardContract, "math", {"cases": [(Task("t", "x?", "4"), "so \\boxed{4}", 1.0)]}),
    (TrajectoryFilterContract, "dynamic_sampling", {}),
    (WorkflowContract, "single_turn", {}),
    (WorkflowContract, "solve_verify", {"replies": {"solver": "2", "verifier": "yes"}}),
    (LoggerContract, "tensorboard", {}),
]
for _contract, _option, _attrs in SUITES:
    _name = f"Test{_contract.__name__.removesuffix('Contract')}_{_option}"
    globals()[_name] = type(_name, (_contract,), {"option": _option, **_attrs})
