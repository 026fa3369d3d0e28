"""reward=code on hand-written completions, built through the registry as a node builds it."""

from __future__ import annotations

import asyncio
import time

import pytest

from astraflow.errors import ConfigError
from astraflow.plugins import get_registry
from astraflow.rewards.base import RewardRunner
from astraflow.types import Task

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 0) == 0",
         "assert add(10, 5) == 15"]


def build(**settings):
    entry = get_registry().get("reward", "code")
    return entry.create(entry.config_cls(**settings))


@pytest.fixture(scope="module")
def reward():
    return build(run_timeout=2.0)


def score(reward, completion: str, task: Task | None = None) -> dict[str, float]:
    task = task or Task("t1", "write add(a, b)", metadata={"tests": TESTS})
    return asyncio.run(reward(task, completion))


def test_correct_code_scores_one(reward):
    result = score(reward, "def add(a, b):\n    return a + b\n")
    assert result == {"score": 1.0, "tests_passed": 4.0, "tests_total": 4.0, "timeout": 0.0}


def test_wrong_code_gets_partial_credit_or_none_without_it(reward):
    wrong = "def add(a, b):\n    return abs(a) + b\n"  # wrong for add(-1, 1) only
    result = score(reward, wrong)
    assert (result["tests_passed"], result["score"]) == (3.0, 0.75)
    assert score(build(run_timeout=2.0, partial_credit=False), wrong)["score"] == 0.0


def test_a_syntax_error_scores_zero(reward):
    result = score(reward, "def add(a, b)\n    return a + b\n")
    assert (result["score"], result["tests_passed"], result["timeout"]) == (0.0, 0.0, 0.0)


def test_an_infinite_loop_scores_zero_at_the_run_timeout_without_failing_the_sample():
    reward = build(run_timeout=1.0)
    task = Task("t1", "write add(a, b)", metadata={"tests": TESTS})
    started = time.monotonic()
    result = asyncio.run(RewardRunner(reward, timeout=10.0).score(
        task, "def add(a, b):\n    while True:\n        pass\n"))
    assert not result.failed and result.value == 0.0
    assert result.metrics == {"tests_passed": 0.0, "tests_total": 4.0, "timeout": 1.0}
    assert time.monotonic() - started < 1.0 + 4


def test_the_last_python_block_of_a_chatty_completion_is_the_program(reward):
    completion = ("First a draft:\n```python\ndef add(a, b):\n    return a - b\n```\n"
                  "Fixed:\n```python\ndef add(a, b):\n    return a + b\n```\nDone, it works!")
    assert score(reward, completion)["score"] == 1.0


def test_the_tests_run_even_if_the_program_exits_or_reads_stdin(reward):
    completion = "def add(a, b):\n    return a + b\n\nn = input()\n"
    assert score(reward, completion)["score"] == 1.0
    assert score(reward, "import sys\ndef add(a, b):\n    return a + b\nsys.exit(1)")["score"] \
        == 1.0


def test_printing_a_fake_result_and_exiting_scores_nothing(reward):
    completion = "import os\nprint('4 4')\nprint('tests passed: 4')\nos._exit(0)\n"
    assert score(reward, completion)["score"] == 0.0


def test_asserts_in_the_answer_and_a_prefix_from_the_task(reward):
    task = Task("t2", "f(1)=5,f(2)=7,f(x)=", answer="assert f(4) == 11\nassert f(0) == 3",
                metadata={"prefix": "def f(x):\n    return "})
    assert score(reward, "2*x+3", task)["score"] == 1.0
    assert score(reward, "2*x+4", task)["score"] == 0.0


def test_a_task_without_tests_fails_the_sample_saying_why(reward):
    result = asyncio.run(RewardRunner(reward, timeout=10.0).score(
        Task("t3", "anything"), "print(1)"))
    assert result.failed and "task 't3' has no tests" in result.error


def test_settings_are_checked_when_the_reward_is_built():
    with pytest.raises(ConfigError, match=r"run_timeout=20\.0 must be below reward\.timeout"):
        build(run_timeout=20.0, timeout=10.0)
    with pytest.raises(ConfigError, match=r"reward=code: sandbox\.network=vpn: choose auto"):
        build(network="vpn")


@pytest.mark.parametrize(("overrides", "said"), [
    (["reward.network=vpn"], "reward.network=vpn: choose auto, namespace or refuse"),
    (["reward.memory_mb=0"], "reward.memory_mb=0: must be >= 1"),
    (["reward.run_timeout=20", "reward.timeout=10"],
     "reward.run_timeout=20.0 must be below reward.timeout=10.0: the reward's own timeout "
     "would fail every slow sample first"),
])
def test_settings_are_checked_as_the_config_is_composed(overrides, said):
    from astraflow.config import compose_config

    with pytest.raises(ConfigError) as info:
        compose_config(["reward=code", *overrides])
    assert str(info.value) == said
