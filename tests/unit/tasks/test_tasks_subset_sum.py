"""task=subset_sum and reward=subset_sum: any listed numbers that add up are right."""

from __future__ import annotations

import pytest

from astraflow.errors import ConfigError
from astraflow.tasks.subset_sum import SubsetSumConfig, SubsetSumReward, SubsetSumTasks
from astraflow.types import Task


def test_every_problem_is_solvable_by_three_numbers_and_by_no_single_one():
    tasks = SubsetSumTasks(SubsetSumConfig(num_train=300, num_eval=50))
    train, held_out = list(tasks.train_tasks()), tasks.eval_tasks()
    assert len(train) == 300 and len(held_out) == 50
    reward = SubsetSumReward()
    prompts = set()
    for task in train + held_out:
        numbers, target = task.metadata["numbers"], task.metadata["target"]
        assert task.prompt == f"{','.join(map(str, numbers))} to {target}="
        assert reward(task, task.answer) == 1.0 and task.answer.count("+") == 2  # pick 3
        assert target not in numbers
        for wrong in task.metadata["wrong"]:  # listed numbers, another sum
            assert reward(task, wrong) == 0.0
            assert all(int(n) in numbers for n in wrong.split("+"))
        prompts.add(task.prompt)
    # no held-out problem is trained on
    assert len(prompts) == 350
    # the same seed draws the same problems
    again = SubsetSumTasks(SubsetSumConfig(num_train=300, num_eval=50))
    assert [t.prompt for t in again.eval_tasks()] == [t.prompt for t in held_out]


def test_the_reward_takes_any_subset_with_the_sum_and_nothing_else():
    task = Task("t", "2,5,3,4 to 9=", "5+4", metadata={"numbers": [2, 5, 3, 4], "target": 9})
    reward = SubsetSumReward()
    right = ["5+4", "4+5", "2+3+4", " 4+3+2 "]
    wrong = ["9", "5+5", "6+3", "2+3+4+0", "5+4+", "5 + 4", "5+4=9", "", "x"]
    assert [reward(task, c) for c in right] == [1.0] * len(right)
    assert [reward(task, c) for c in wrong] == [0.0] * len(wrong)
    # a number listed twice may be used twice
    twice = Task("d", "3,3,8 to 6=", "3+3", metadata={"numbers": [3, 3, 8], "target": 6})
    assert reward(twice, "3+3") == 1.0
    with pytest.raises(ValueError, match="task=subset_sum"):
        reward(Task("a", "1+2=", "3"), "3")


def test_a_space_too_small_for_the_split_is_refused_with_the_numbers():
    with pytest.raises(ConfigError, match=r"only \d+ distinct subset-sum problems"):
        SubsetSumTasks(SubsetSumConfig(size=2, pick=2, max_number=3, num_train=100, num_eval=10))
    with pytest.raises(ConfigError, match=r"task\.pick=5: choose 2\.\.4"):
        SubsetSumTasks(SubsetSumConfig(size=4, pick=5))

