"""Solver + test-case generator: a tester policy writes tests, the solver's code must pass.

Protocol (in the tiny model's characters): the tester sees the problem and writes test
cases, one per line, as Python conditions (``f(4)==11``); the solver sees those tests
above the problem and writes its solution ``k`` times::

    tester:  f(1)=5,f(2)=7,f(x)=        ->  f(4)==11
    solver:  f(4)==11\\nf(1)=5,f(2)=7,f(x)=  ->  2*x+3

Credit, each role for what it controls:

- Every solver candidate is rewarded by the run's reward on the task's *hidden* tests
  (``reward=code``), grouped with the task's other candidates. The generated tests are
  its context (loss-masked): they can help it, never grade it.
- The tester's tests are run in the sandbox against the task's reference solution
  (``reference`` in the task's metadata, else its answer) and against the candidates
  the solver wrote for them. Tests that fail the reference (or do not run) earn 0:
  they would reject right code. Valid tests earn ``0.5 + 0.5 * d``, ``d`` the share of
  the wrong candidates (those failing a hidden test) that they reject -- 1 when every
  candidate was right, as there was nothing to catch.

Programs are the task's ``prefix`` (e.g. a function header) followed by the solution;
every run goes through one :class:`~astraflow.sandbox.Sandbox` with its limits.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from astraflow.contracts import PolicyHandle
from astraflow.sandbox import Sandbox, SandboxConfig
from astraflow.schema import like, setting
from astraflow.types import RewardOutcome, Task, Trajectory
from astraflow.workflows.builder import (
    WORKFLOW,
    AttemptsWorkflow,
    EnvConfig,
    TrajectoryBuilder,
    WorkflowConfig,
    without_stop,
)
from astraflow.workflows.tools import sandbox_from

TESTS = "\ntest:"
#: most test lines taken from one tester answer
MAX_TESTS = 4


@dataclass
class SolveTestgenConfig(EnvConfig, WorkflowConfig):
    """``workflow=solve_testgen``: ``candidates`` solver samples per set of tests."""

    name: str = "solve_testgen"
    candidates: int = setting(2, ge=1)
    tester_max_new_tokens: int = like(WORKFLOW["max_new_tokens"], default=16)
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(timeout=5.0))


def parse_tests(text: str) -> list[str]:
    """The test conditions of a tester's answer: its non-empty lines, at most MAX_TESTS."""
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line][:MAX_TESTS]


def test_program(task: Task, solution: str, tests: list[str]) -> str:
    """A program that exits 0 exactly when ``solution`` passes every one of ``tests``."""
    prefix = str(task.metadata.get("prefix", "") or "")
    checks = "".join(f"assert ({test})\n" for test in tests)
    return f"{prefix}{solution}\n{checks}"


class SolveTestgenWorkflow(AttemptsWorkflow):
    roles = ("solver", "tester")

    def __init__(self, config, tokenizer, reward) -> None:
        super().__init__(config, tokenizer, reward)
        self._sandbox: Sandbox | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:  # built on first use: a config check starts nothing
            self._sandbox = sandbox_from(self.config.sandbox)
        return self._sandbox

    @staticmethod
    def warmstart_tasks(tasks: list[Task], seed: int = 0) -> list[Task]:
        """The task's answers, with and without tests above them, and valid tests (taken
        from the task's hidden ones, written as conditions)."""
        rng = random.Random(seed)
        out = list(tasks)
        for task in tasks:
            hidden = [t.removeprefix("assert").strip().replace(" ", "")
                      for t in task.metadata.get("tests", [])]
            if not hidden:
                continue
            test = rng.choice(hidden)
            out.append(Task(f"{task.task_id}:test", f"{task.prompt}{TESTS}", test))
            out.append(Task(f"{task.task_id}:with-test", f"{test}\n{task.prompt}",
                            task.answer))
        return out

    async def _passes(self, task: Task, solution: str, tests: list[str]) -> bool:
        result = await self.sandbox.run(test_program(task, solution, tests))
        return result.ok

    async def _attempt(self, task: Task, policies: dict[str, PolicyHandle],
                       group_id: str) -> list[Trajectory]:
        tok, cfg = self.tokenizer, self.config
        prompt = tok.encode_prompt(task.prompt)
        tester = TrajectoryBuilder(task.task_id, group_id)
        tester.add_context(prompt)
        tester.add_context(tok.encode(TESTS))
        await self.latency.wait()
        (test_gen,) = await policies["tester"].generate(
            tester.tokens, n=1, max_new_tokens=cfg.tester_max_new_tokens,
            temperature=cfg.temperature, stop_token_ids=tok.stop_token_ids)
        tester.add_generation("tester", test_gen)
        tests = parse_tests(self.completion_text(test_gen.token_ids))
        reference = str(task.metadata.get("reference") or task.answer or "")
        valid_run = (self._passes(task, reference, tests) if tests
                     else asyncio.sleep(0, result=False))
        # the solver sees the tests (as the tester wrote them) above the problem
        context = TrajectoryBuilder(task.task_id, group_id)
        context.add_generation("tester", without_stop(test_gen, tok.stop_token_ids))
        context.add_context(tok.encode("\n"))
        context.add_context(prompt)
        await self.latency.wait()
        gens = await policies["solver"].generate(
            context.tokens, n=cfg.candidates, max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature, stop_token_ids=tok.stop_token_ids)
        texts = [self.completion_text(g.token_ids).strip() for g in gens]
        valid, scores, caught = await asyncio.gather(
            valid_run,
            asyncio.gather(*(self.score(task, text) for text in texts)),
            asyncio.gather(*(self._passes(task, text, tests) if tests
                             else asyncio.sleep(0, result=True) for text in texts)))
        wrong = [not passed for passed, s in zip(caught, scores, strict=True)
                 if s.value < 1.0 and not s.failed]
        discrimination = sum(wrong) / len(wrong) if wrong else 1.0
        reward = 0.5 + 0.5 * discrimination if valid else 0.0
        meta = {"task_type": task.task_type}
        metrics = {"tests_valid": float(valid), "discrimination": discrimination,
                   "tests": float(len(tests))}
        out = []
        for gen, score in zip(gens, scores, strict=True):
            builder = context.copy()
            builder.add_generation("solver", gen)
            outcome = score.outcome
            if not score.failed:
                outcome.metrics["tests_valid"] = float(valid)
            out.append(builder.build("solver", score.value, meta, outcome))
        failed = [s for s in scores if s.failed]
        out.append(tester.build("tester", reward, meta,
                                failed[0].outcome if failed and tests and valid
                                else RewardOutcome(metrics=metrics)))
        return out
