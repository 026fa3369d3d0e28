"""``reward=code``: the completion's Python, run against the task's test cases.

The program is the completion's last ```python block (else the whole completion), after
``task.metadata["prefix"]`` when the task gives one (a function header the completion
goes on from, as ``task=functions`` does). The tests are assert statements (``"assert
f(2) == 5"``) from ``task.metadata["tests"]``, else the lines of ``task.answer``.

The program and all its tests run in ONE sandbox run (:mod:`astraflow.sandbox`): one
interpreter start per sample instead of one per test, and a program that hangs costs
one ``reward.run_timeout``, not one per test.

The score is the fraction of tests passed (``partial_credit=false``: 1.0 only when all
pass). A program that raises, exits or reads an empty stdin still has its tests run on
what it defined; one that hangs or is killed at a limit scores zero. Either is a sample
like any other: only a sandbox that cannot run anything fails the sample, so that a
broken node is not read as a wrong policy.

The tests run in the program's own interpreter, so a program written to cheat can fool
them (an object equal to everything, rewriting the harness it runs in); the count is
taken only from a line marked with a random nonce, so the cheap forgeries -- printing
"all tests passed", exiting early -- score nothing.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from dataclasses import dataclass
from typing import Any

from astraflow.contracts import Reward
from astraflow.errors import ConfigError
from astraflow.rewards.base import RewardConfig
from astraflow.sandbox import Sandbox, SandboxConfig
from astraflow.schema import like, setting
from astraflow.types import Task

#: the last fenced python block: models often show a draft before their final answer
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)

#: runs the program, then each test in its namespace; the program's own output goes to
#: /dev/null so that it cannot push the count past the output limit or forge it
_HARNESS = """\
import os as _os
import sys as _sys
import traceback as _traceback


def _astraflow_tests(program, tests, nonce):
    out = _sys.stdout
    _sys.stdout = open(_os.devnull, "w")
    namespace = {{"__name__": "__main__", "__builtins__": __builtins__}}
    try:
        exec(compile(program, "solution.py", "exec"), namespace)
    except BaseException:  # the tests still see what it defined before it failed
        _traceback.print_exc()
    passed = 0
    for test in tests:
        try:
            exec(compile(test, "test", "exec"), namespace)
        except BaseException:
            continue
        passed += 1
    out.write(f"\\n{{nonce}} {{passed}}\\n")
    out.flush()


_astraflow_tests({program!r}, {tests!r}, {nonce!r})
"""


_SANDBOX = {f.name: f for f in dataclasses.fields(SandboxConfig)}


@dataclass
class CodeRewardConfig(RewardConfig):
    """``run_timeout`` is the sandbox's wall-clock limit for the program and all its tests.
    ``timeout`` is the sample's own limit, and it includes the wait for one of the
    ``concurrency`` sandbox slots: a node scores many samples at once (16 tasks x 8
    samples is 128 programs for 4 slots), so it is a safety net far above
    ``run_timeout``, which is what bounds a program."""

    name: str = "code"
    timeout: float = setting(600.0, gt=0)
    # the sandbox's own settings, with its defaults and ranges
    run_timeout: float = like(_SANDBOX["timeout"])
    memory_mb: int = like(_SANDBOX["memory_mb"])
    concurrency: int = like(_SANDBOX["concurrency"])
    max_processes: int = like(_SANDBOX["max_processes"])
    max_output_bytes: int = like(_SANDBOX["max_output_bytes"])
    network: str = like(_SANDBOX["network"])
    partial_credit: bool = True

    @staticmethod
    def relations(reward: Any) -> list[str]:
        """The sandbox's limit bounds a program, below the sample's own."""
        if reward.run_timeout < reward.timeout:
            return []
        return [f"reward.run_timeout={reward.run_timeout} must be below reward.timeout="
                f"{reward.timeout}: the reward's own timeout would fail every slow sample "
                "first"]


def extract_program(completion: str) -> str:
    """The last ```python block of the completion, or the whole completion."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def task_tests(task: Task) -> list[str]:
    """The task's assert statements: ``metadata["tests"]`` (a list, or lines of text),
    else the lines of ``answer``."""
    tests: Any = task.metadata.get("tests") or task.answer or ""
    if isinstance(tests, str):
        tests = tests.splitlines()
    tests = [str(test) for test in tests if str(test).strip()]
    if not tests:
        raise ValueError(f"task {task.task_id!r} has no tests for reward=code: give "
                         "metadata['tests'] (assert statements) or asserts in answer")
    return tests


class CodeReward(Reward):
    """Fraction of the task's asserts that pass after the completion's program ran."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        config = config or CodeRewardConfig()
        self.partial_credit = bool(config.partial_credit)
        if wrong := CodeRewardConfig.relations(config):
            raise ConfigError(wrong[0])
        try:
            self.sandbox = Sandbox(SandboxConfig(
                timeout=config.run_timeout, memory_mb=config.memory_mb,
                max_processes=config.max_processes, max_output_bytes=config.max_output_bytes,
                concurrency=config.concurrency, network=config.network))
        except (RuntimeError, ValueError) as exc:  # ValueError: a limit out of its range
            raise ConfigError(f"reward=code: {exc}") from None

    async def __call__(self, task: Task, completion: str) -> dict[str, float]:
        tests = task_tests(task)
        nonce = secrets.token_hex(16)
        program = str(task.metadata.get("prefix") or "") + extract_program(completion)
        harness = _HARNESS.format(program=program, tests=tests, nonce=nonce)
        result = await self.sandbox.run(harness)
        if result.status == "sandbox_error":
            raise RuntimeError(f"the sandbox could not run the program: {result.stderr.strip()}")
        passed = 0 if result.status == "timeout" else _passed(result.stdout, nonce)
        total = len(tests)
        score = passed / total if self.partial_credit else float(passed == total)
        return {"score": score, "tests_passed": float(passed), "tests_total": float(total),
                "timeout": float(result.status == "timeout")}


def _passed(stdout: str, nonce: str) -> int:
    for line in reversed(stdout.splitlines()):
        word, _, count = line.partition(" ")
        if word == nonce and count.isdigit():
            return int(count)
    return 0
