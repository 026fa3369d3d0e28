"""One prompt, one completion per sample, reward from the task's reward function."""

from __future__ import annotations

from dataclasses import dataclass, field

from astraflow.config import setting
from astraflow.contracts import PolicyHandle
from astraflow.types import Task, Trajectory
from astraflow.workflows.builder import EnvWorkflow, TrajectoryBuilder
from astraflow.workflows.groups import GroupConfig, first_of, sizes
from astraflow.workflows.latency import LatencyConfig


@dataclass
class SingleTurnConfig:
    """``workflow=single_turn``."""

    name: str = "single_turn"
    max_new_tokens: int = setting(6, ge=1)
    temperature: float = setting(1.0, ge=0)  # 0: greedy
    #: an environment call per sample before it is scored (a verifier service, a
    #: sandbox): ``latency.kind=lognormal latency.median=0.1`` models agentic waits
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    #: over-provisioned groups: start extra samples, train the first back (see
    #: :mod:`astraflow.workflows.groups`)
    group: GroupConfig = field(default_factory=GroupConfig)


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
