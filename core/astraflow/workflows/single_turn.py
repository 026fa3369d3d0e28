"""One prompt, one completion per sample, reward from the task's reward function."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from astraflow.contracts import PolicyHandle, Workflow
from astraflow.types import Task, Trajectory
from astraflow.workflows.builder import TrajectoryBuilder


@dataclass
class SingleTurnConfig:
    """``workflow=single_turn``."""

    name: str = "single_turn"
    max_new_tokens: int = 6
    temperature: float = 1.0


class SingleTurnWorkflow(Workflow):
    roles = ("policy",)

    async def run(
        self, task: Task, policies: dict[str, PolicyHandle], group_size: int
    ) -> list[Trajectory]:
        (role,) = self.roles
        prompt_ids = self.tokenizer.encode_prompt(task.prompt)
        generations = await policies[role].generate(
            prompt_ids,
            n=group_size,
            max_new_tokens=self.config.max_new_tokens,
            temperature=self.config.temperature,
            stop_token_ids=self.tokenizer.stop_token_ids,
        )
        scores = await asyncio.gather(*(self.score(task, self.completion_text(gen.token_ids))
                                        for gen in generations))
        out = []
        for gen, score in zip(generations, scores, strict=True):
            builder = TrajectoryBuilder(task.task_id, task.metadata.get("group_id", task.task_id))
            builder.add_context(prompt_ids)
            builder.add_generation(role, gen)
            out.append(builder.build(role, score.value,
                                     {"task_type": task.task_type, **score.metadata()}))
        return out
