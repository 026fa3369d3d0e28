"""GRESO: skip prompts whose recent rollouts taught nothing, with adaptive probabilities.

Per task it keeps ``z``, the number of consecutive groups with zero reward variance,
and the kind of the last such group (easy: all right; hard: all wrong). A group with
variance resets ``z``. Skipping is probabilistic, so a prompt the policy has outgrown
or not yet reached is still revisited now and then.
"""

from __future__ import annotations

import random
from typing import Any

from astraflow.contracts import TaskSelector
from astraflow.types import Task

KINDS = ("easy", "hard")


class Greso(TaskSelector):
    def __init__(self, config: Any = None) -> None:
        from astraflow_data_greso import GresoConfig

        super().__init__(config if config is not None else GresoConfig())
        cfg = self.config
        self.p = {kind: cfg.p_init for kind in KINDS}
        self.floor = {"easy": cfg.floor_easy, "hard": cfg.floor_hard}
        self.alpha = {"easy": cfg.alpha_easy, "hard": cfg.alpha_hard}
        self.tasks: dict[str, list] = {}  # task id -> [z, kind]
        self.window = {"easy": 0, "hard": 0, "total": 0}  # rollouts since the last version
        self.warmed_up = False
        self.rng = random.Random(cfg.seed)

    def skip_probability(self, task_id: str) -> float:
        z, kind = self.tasks.get(task_id, (0, "hard"))
        if z == 0:
            return 0.0
        return 1.0 - max(self.p[kind] ** z, self.floor[kind])

    def should_issue(self, task: Task) -> bool:
        skip = self.skip_probability(task.task_id)
        return skip == 0.0 or self.rng.random() >= skip

    def observe_group(self, task: Task, policy: str, rewards: list[float]) -> None:
        if (self.config.policy is not None and policy != self.config.policy) or not rewards:
            return
        if task.task_id in self.tasks:
            # a task seen again means the dataset has been through one pass
            self.warmed_up = True
        entry = self.tasks.setdefault(task.task_id, [0, "hard"])
        self.window["total"] += 1
        if max(rewards) - min(rewards) > 0:
            entry[0] = 0
            return
        kind = "easy" if sum(rewards) / len(rewards) > self.config.easy_threshold else "hard"
        entry[0] += 1
        entry[1] = kind
        self.window[kind] += 1

    def on_new_version(self, policy: str, version: int) -> None:
        if self.config.policy is not None and policy != self.config.policy:
            return
        if self.warmed_up and self.window["total"]:
            cfg = self.config
            for kind in KINDS:
                ratio = self.window[kind] / self.window["total"]
                step = -cfg.adjust if ratio >= self.alpha[kind] else cfg.adjust
                self.p[kind] = min(cfg.p_max, max(cfg.p_min, self.p[kind] + step))
        self.window = {"easy": 0, "hard": 0, "total": 0}

    def state_dict(self) -> dict[str, Any]:
        return {"p": dict(self.p), "tasks": {k: list(v) for k, v in self.tasks.items()},
                "window": dict(self.window), "warmed_up": self.warmed_up,
                "rng": list(self.rng.getstate()[1])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.p = dict(state["p"])
        self.tasks = {k: list(v) for k, v in state["tasks"].items()}
        self.window = dict(state["window"])
        self.warmed_up = bool(state["warmed_up"])
        rng_state = state.get("rng")
        if rng_state:
            self.rng.setstate((3, tuple(rng_state), None))
