"""A plugin's workflow that subclasses ``SingleTurnWorkflow`` with a config dataclass of
its own runs on what that config declares: the base class reads its own settings with
their defaults, never a key the subclass's config lacks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from omegaconf import OmegaConf

from astraflow.rewards.exact_match import ExactMatch
from astraflow.testing.scripted import ScriptedPolicy
from astraflow.text import load_tokenizer
from astraflow.types import Task
from astraflow.workflows.single_turn import SingleTurnConfig, SingleTurnWorkflow


@dataclass
class PrefixedConfig:
    """A subclass's own settings: no max_new_tokens, temperature or latency."""

    name: str = "prefixed"
    prefix: str = "0+"


class PrefixedWorkflow(SingleTurnWorkflow):
    async def run(self, task, policies, group_size):
        task = Task(task.task_id, self.config.prefix + task.prompt, task.answer)
        return await super().run(task, policies, group_size)


class Recording(ScriptedPolicy):
    async def generate(self, prompt_ids, **kwargs):
        self.asked = kwargs
        return await super().generate(prompt_ids, **kwargs)


def test_a_subclass_config_without_the_base_settings_runs_at_their_defaults(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    # as a run passes it: a struct node of the subclass's dataclass, where reading an
    # undeclared key raises
    config = OmegaConf.structured(PrefixedConfig(prefix="1+"))
    workflow = PrefixedWorkflow(config, tok, ExactMatch())
    policy = Recording("policy", tok, lambda ctx: "19")
    trajs = asyncio.run(workflow.run(Task("t1", "12+7=", "19"), {"policy": policy}, 3))
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0]
    assert policy.contexts == ["1+12+7="]
    defaults = SingleTurnConfig()
    assert (policy.asked["max_new_tokens"], policy.asked["temperature"]) == (
        defaults.max_new_tokens, defaults.temperature)


def test_settings_a_subclass_config_does_declare_are_the_ones_used(tiny_model_dir):
    @dataclass
    class Longer(PrefixedConfig):
        max_new_tokens: int = 11

    tok = load_tokenizer(tiny_model_dir)
    workflow = PrefixedWorkflow(OmegaConf.structured(Longer()), tok, ExactMatch())
    policy = Recording("policy", tok, lambda ctx: "19")
    asyncio.run(workflow.run(Task("t1", "12+7=", "19"), {"policy": policy}, 1))
    assert policy.asked["max_new_tokens"] == 11
