"""``reward=compat_digits``."""

from __future__ import annotations

from typing import Any

from astraflow.contracts import Reward
from astraflow.types import Task


class Digits(Reward):
    inline = True  # a string comparison

    def __call__(self, task: Task, completion: str) -> dict[str, Any]:
        answer, given = (task.answer or "").strip(), completion.strip()
        if given == answer:
            return {"score": 1.0, "exact": 1.0}
        right = sum(a == b for a, b in zip(answer, given, strict=False))
        return {"score": self.config.partial * right / max(len(answer), 1), "exact": 0.0}
