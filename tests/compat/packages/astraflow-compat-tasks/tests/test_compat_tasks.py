"""The task pack passes AstraFlow's shared contracts."""

from astraflow.testing.contracts import RewardContract, TaskSelectorContract, TaskSourceContract
from astraflow.types import Task


class TestSums(TaskSourceContract):
    option = "compat_sums"


class TestMastery(TaskSelectorContract):
    option = "compat_mastery"
    settings = {"patience": 1, "revisit_every": 3}


class TestDigits(RewardContract):
    option = "compat_digits"
    cases = [(Task("t1", "1+1=", "2"), "2", 1.0), (Task("t2", "7+8=", "15"), " 15", 1.0),
             (Task("t3", "7+8=", "15"), "14", 0.25), (Task("t4", "7+8=", "15"), "", 0.0)]
