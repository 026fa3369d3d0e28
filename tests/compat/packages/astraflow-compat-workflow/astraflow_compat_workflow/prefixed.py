"""``workflow=compat_prefixed``."""

from __future__ import annotations

import dataclasses
from typing import Any

from astraflow.contracts import PolicyHandle
from astraflow.errors import ConfigError
from astraflow.types import Task, Trajectory
from astraflow.workflows.single_turn import SingleTurnWorkflow

#: longest prefix accepted (the tiny models' context is short)
MAX_PREFIX = 32


class PrefixedWorkflow(SingleTurnWorkflow):
    @classmethod
    def check_config(cls, config: Any) -> None:
        if len(config.prompt_prefix) > MAX_PREFIX:
            raise ConfigError(f"workflow.prompt_prefix is {len(config.prompt_prefix)} "
                              f"characters long; at most {MAX_PREFIX}")

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        if isinstance(task.prompt, str):
            task = dataclasses.replace(task, prompt=self.config.prompt_prefix + task.prompt)
        return await super().run(task, policies, group_size)
