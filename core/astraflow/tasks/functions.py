"""``task=functions``: write a small Python function from examples of it, graded by tests.

A code task the built-in tiny model can spell (digits, ``x``, ``+-*``): the prompt shows
a few values of a hidden linear function and asks for its body, ``f(1)=5,f(2)=7,f(x)=``;
the answer is an expression in ``x`` (``2*x+3``) that becomes ``def f(x): return ...``.
Each task carries what ``reward=code`` and the code workflows need in its metadata --
the same fields a JSON Lines code dataset (``task=jsonl``) would carry per row:

- ``tests``: hidden test cases, Python asserts (``assert f(4) == 11``);
- ``prefix``: the code put in front of the completion (the function header);
- ``reference``: a correct completion, for judging generated tests.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from astraflow.contracts import TaskSource
from astraflow.errors import ConfigError
from astraflow.schema import setting
from astraflow.types import Task

PREFIX = "def f(x):\n    return "


@dataclass
class FunctionsConfig:
    """``f(x) = a*x + b`` with ``a`` in ``1..max_slope`` and ``b`` in ``-max_offset..
    max_offset``; ``examples`` values shown at x = 1, 2, ...; ``num_tests`` hidden tests
    at other points; ``num_eval`` functions held out (chosen with ``seed``)."""

    name: str = "functions"
    max_slope: int = setting(5, ge=1)
    max_offset: int = setting(9, ge=0)
    examples: int = setting(2, ge=2, why="a line needs two points")
    num_tests: int = setting(4, ge=1)
    num_eval: int = setting(30, ge=0)
    seed: int = setting(1234, ge=0)

    @staticmethod
    def relations(task) -> list[str]:
        """Functions are held out for eval, the rest trained on: some must be left."""
        space = task.max_slope * (2 * task.max_offset + 1)
        if task.num_eval < space:
            return []
        return [f"task.num_eval={task.num_eval}: choose 0..{space - 1} (there are {space} "
                "functions)"]


def expression(a: int, b: int) -> str:
    """The canonical body of ``a*x + b``."""
    body = "x" if a == 1 else f"{a}*x"
    return body if b == 0 else f"{body}{b:+d}"


class FunctionTasks(TaskSource):
    """Every function of the space, split once (seeded) into train and held-out eval."""

    def __init__(self, config: FunctionsConfig | None = None) -> None:
        super().__init__(config or FunctionsConfig())
        cfg = self.config
        if wrong := FunctionsConfig.relations(cfg):
            raise ConfigError(wrong[0])
        space = [(a, b) for a in range(1, cfg.max_slope + 1)
                 for b in range(-cfg.max_offset, cfg.max_offset + 1)]
        rng = random.Random(cfg.seed)
        rng.shuffle(space)
        self._eval = [self._task(a, b, "eval") for a, b in space[: cfg.num_eval]]
        self._train = [self._task(a, b, "train") for a, b in space[cfg.num_eval:]]

    def _task(self, a: int, b: int, split: str) -> Task:
        cfg = self.config
        shown = ",".join(f"f({x})={a * x + b}" for x in range(1, cfg.examples + 1))
        points = range(cfg.examples + 1, cfg.examples + 1 + cfg.num_tests)
        tests = [f"assert f({x}) == {a * x + b}" for x in points]
        body = expression(a, b)
        return Task(task_id=f"{split}-{a}x{b:+d}", prompt=f"{shown},f(x)=", answer=body,
                    task_type="functions",
                    metadata={"tests": tests, "prefix": PREFIX, "reference": body})

    def train_tasks(self) -> Iterator[Task]:
        return iter(self._train)

    def eval_tasks(self) -> list[Task]:
        return list(self._eval)
