"""``data=compat_mastery``: per task, how often it was asked about, how many groups in a
row were all right, and how many groups were seen."""

from __future__ import annotations

from typing import Any

from astraflow.contracts import TaskSelector
from astraflow.types import Task


class Mastery(TaskSelector):
    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        #: task id -> [asked, streak of all-right groups, groups]
        self.counts: dict[str, list[int]] = {}

    def should_issue(self, task: Task) -> bool:
        entry = self.counts.setdefault(task.task_id, [0, 0, 0])
        entry[0] += 1
        if entry[1] >= self.config.patience:
            return entry[0] % self.config.revisit_every == 0
        return True

    def observe_group(self, task: Task, policy: str, rewards: list[float]) -> None:
        if not rewards or self.config.policy not in (None, policy):
            return
        entry = self.counts.setdefault(task.task_id, [0, 0, 0])
        entry[1] = entry[1] + 1 if min(rewards) >= 1.0 else 0
        entry[2] += 1

    def state_dict(self) -> dict[str, Any]:
        return {"counts": {task_id: list(entry) for task_id, entry in self.counts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {task_id: list(entry) for task_id, entry in state["counts"].items()}
