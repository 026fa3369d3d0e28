"""One prompt, one completion per sample, reward from the task's reward function."""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.contracts import PolicyHandle
from astraflow.schema import like
from astraflow.types import Task, Trajectory
from astraflow.workflows.builder import (
    WORKFLOW,
    EnvConfig,
    EnvWorkflow,
    TrajectoryBuilder,
    WorkflowConfig,
)
from astraflow.workflows.groups import first_of, sizes


@dataclass
class SingleTurnConfig(EnvConfig, WorkflowConfig):
    """``workflow=single_turn``: its sampling (:class:`WorkflowConfig`), its waits and
    groups (:class:`EnvConfig`)."""

    name: str = "single_turn"
    max_new_tokens: int = like(WORKFLOW["max_new_tokens"], default=6)


class SingleTurnWorkflow(EnvWorkflow):
    """One prompt, ``group_size`` sampled completions, each scored by the reward.

    A subclass with a config of its own need not declare ``max_new_tokens``,
    ``temperature`` or ``latency``: ``self.settings`` has them, at
    :class:`SingleTurnConfig`'s defaults where the subclass's config lacks them.
    """

    roles = ("policy",)
    settings_class = SingleTurnConfig

    async def _score(self, task: Task, token_ids: list[int]):
        await self.latency.wait()
        return await self.score(task, self.completion_text(token_ids))

    async def run(
        self, task: Task, policies: dict[str, PolicyHandle], group_size: int
    ) -> list[Trajectory]:
        (role,) = self.roles
        prompt_ids = self.tokenizer.encode_prompt(task.prompt)
        # an over-provisioned group generates its extra samples with the rest (one
        # request: they share the prompt) and keeps the first to come back scored
        started, keep = sizes(group_size)
        generations = await policies[role].generate(
            prompt_ids,
            n=started,
            max_new_tokens=self.settings.max_new_tokens,
            temperature=self.settings.temperature,
            stop_token_ids=self.tokenizer.stop_token_ids,
        )

        async def scored(i: int):
            return generations[i], await self._score(task, generations[i].token_ids)

        out = []
        for gen, score in await first_of(scored, started, keep, reward=lambda s: s[1].value):
            builder = TrajectoryBuilder(task.task_id, task.metadata.get("group_id", task.task_id))
            builder.add_context(prompt_ids)
            builder.add_generation(role, gen)
            out.append(builder.build(role, score.value, {"task_type": task.task_type},
                                     score.outcome))
        return out
