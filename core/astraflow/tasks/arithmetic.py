"""A small-integer arithmetic task with an exact-match reward and a held-out split."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from astraflow.contracts import TaskSource
from astraflow.schema import setting
from astraflow.types import Task


@dataclass
class ArithmeticConfig:
    """``task=arithmetic``: ``a+b=`` / ``a-b=`` problems over operands ``0..max_operand``."""

    name: str = "arithmetic"
    max_operand: int = setting(20, ge=0)
    ops: str = setting("+-", choices=("+-", "+", "-", "-+"))
    num_eval: int = setting(100, ge=0)
    seed: int = setting(1234, ge=0)

    @staticmethod
    def relations(task) -> list[str]:
        """Problems are held out for eval, the rest trained on: some must be left."""
        space = (task.max_operand + 1) ** 2 * len(task.ops)
        if task.num_eval < space:
            return []
        return [f"task.num_eval={task.num_eval}: choose 0..{space - 1} (there are {space} "
                "problems, and some must be left to train on)"]


class ArithmeticTasks(TaskSource):
    """Every problem of the space, split once (seeded) into train and held-out eval."""

    def __init__(self, config: ArithmeticConfig | None = None) -> None:
        super().__init__(config or ArithmeticConfig())
        cfg = self.config
        problems = [
            (a, op, b)
            for a in range(cfg.max_operand + 1)
            for b in range(cfg.max_operand + 1)
            for op in cfg.ops
        ]
        rng = random.Random(cfg.seed)
        rng.shuffle(problems)
        self._eval = [self._task(p, "eval") for p in problems[: cfg.num_eval]]
        self._train = [self._task(p, "train") for p in problems[cfg.num_eval :]]

    @staticmethod
    def _task(problem: tuple[int, str, int], split: str) -> Task:
        a, op, b = problem
        answer = a + b if op == "+" else a - b
        kind = "add" if op == "+" else "sub"
        return Task(
            task_id=f"{split}-{a}{op}{b}", prompt=f"{a}{op}{b}=", answer=str(answer), task_type=kind
        )

    def train_tasks(self) -> Iterator[Task]:
        return iter(self._train)

    def eval_tasks(self) -> list[Task]:
        return list(self._eval)
