"""The exact-match reward (the default: the arithmetic task's)."""

from __future__ import annotations

from astraflow.contracts import Reward
from astraflow.types import Task


class ExactMatch(Reward):
    """1.0 when the completion, stripped, equals the task's answer."""

    inline = True

    def __call__(self, task: Task, completion: str) -> float:
        return float(completion.strip() == (task.answer or "").strip())
