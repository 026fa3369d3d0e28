"""``task=compat_sums``."""

from __future__ import annotations

import random
from collections.abc import Iterator

from astraflow.contracts import TaskSource
from astraflow.errors import ConfigError
from astraflow.types import Task


class SumTasks(TaskSource):
    def _problems(self) -> list[tuple[int, int]]:
        top = self.config.max_operand
        pairs = [(a, b) for a in range(top + 1) for b in range(top + 1)]
        random.Random(self.config.seed).shuffle(pairs)
        return pairs

    @staticmethod
    def _task(a: int, b: int) -> Task:
        return Task(task_id=f"sums-{a}+{b}", prompt=f"{a}+{b}=", answer=str(a + b),
                    task_type="sum")

    def preflight(self) -> None:
        cfg = self.config
        have = (cfg.max_operand + 1) ** 2
        if cfg.num_train + cfg.num_eval > have:
            raise ConfigError(f"task.num_train + task.num_eval = "
                              f"{cfg.num_train + cfg.num_eval} but task.max_operand="
                              f"{cfg.max_operand} gives {have} sums")

    def train_tasks(self) -> Iterator[Task]:
        start = self.config.num_eval
        for a, b in self._problems()[start:start + self.config.num_train]:
            yield self._task(a, b)

    def eval_tasks(self) -> list[Task]:
        return [self._task(a, b) for a, b in self._problems()[:self.config.num_eval]]

    def stats(self) -> dict[str, int]:
        return {"train": self.config.num_train, "eval": self.config.num_eval}
