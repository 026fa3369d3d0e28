"""Build trajectories from a conversation of prompt, policy and tool tokens."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

from astraflow.contracts import PolicyHandle, Workflow
from astraflow.schema import setting

# public here since before it moved beside the types (the plugin API's promise)
from astraflow.trajectory import TrajectoryBuilder as TrajectoryBuilder
from astraflow.trajectory import without_stop as without_stop
from astraflow.types import (
    Task,
    Trajectory,
)
from astraflow.workflows.groups import GroupConfig, first_of, sizes
from astraflow.workflows.latency import Latency, LatencyConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")


@dataclass
class WorkflowConfig:
    """What every built-in workflow's config has: its name and how it samples. A
    workflow whose answers are shorter than most gives ``max_new_tokens`` another
    default (``like(WORKFLOW["max_new_tokens"], default=6)``), not another range."""

    name: str = ""
    max_new_tokens: int = setting(12, ge=1)
    temperature: float = setting(1.0, ge=0)  # 0: greedy


#: :class:`WorkflowConfig`'s fields by name, for a subclass's own default of one
WORKFLOW = {f.name: f for f in dataclasses.fields(WorkflowConfig)}


@dataclass
class EnvConfig:
    """What :class:`EnvWorkflow` reads of a workflow's config."""

    #: an environment call per sample before it is scored (a verifier service, a
    #: sandbox): ``latency.kind=lognormal latency.median=0.1`` models agentic waits
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    #: over-provisioned groups: start extra samples, train the first back (see
    #: :mod:`astraflow.workflows.groups`)
    group: GroupConfig = field(default_factory=GroupConfig)


def with_defaults(config: Any, schema: type[S]) -> S:
    """The settings of the dataclass ``schema`` read from ``config`` (a run's option
    config, a dataclass or a dict), each one ``config`` lacks at ``schema``'s default:
    a base class reads its own settings through it, so a subclass's config dataclass
    need not declare them."""
    values = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if isinstance(config, Mapping | DictConfig):
            if f.name not in config:
                continue
            value = config[f.name]
        elif hasattr(config, f.name):
            value = getattr(config, f.name)
        else:
            continue
        # plain values, not config nodes: a workflow reads them per sample, and a
        # DictConfig attribute costs tens of microseconds each time
        if dataclasses.is_dataclass(hints.get(f.name)) and isinstance(value, Mapping
                                                                       | DictConfig):
            value = with_defaults(value, hints[f.name])
        elif isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        values[f.name] = value
    return schema(**values)


class EnvWorkflow(Workflow):
    """A workflow that checks its config when built (``check_config``, which the launcher
    also calls before anything starts) and waits on its environment as
    ``workflow.latency`` says (``self.latency``).

    ``settings`` holds what this class and its bases read of the config, as the
    dataclass ``settings_class`` (:class:`EnvConfig` here; ``SingleTurnConfig`` for the
    single-turn workflow), with defaults for what a subclass's own config does not
    declare; a subclass reads its own settings from ``config``.
    """

    #: the settings this class reads, each with its default
    settings_class: type[Any] = EnvConfig

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise ConfigError, in one line, for a setting this workflow cannot run with."""

    def __init__(self, config: Any, tokenizer: Any, reward: Any) -> None:
        super().__init__(config, tokenizer, reward)
        self.check_config(config)
        self.settings = with_defaults(config, self.settings_class)
        self.latency = Latency(self.settings.latency)


class AttemptsWorkflow(EnvWorkflow):
    """A workflow whose ``group_size`` attempts at a task run concurrently and
    independently: a subclass writes ``_attempt``, returning one attempt's trajectories
    (of every policy), all in the task's group."""

    async def _attempt(self, task: Task, policies: dict[str, PolicyHandle],
                       group_id: str) -> list[Trajectory]:
        raise NotImplementedError

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        group_id = task.metadata.get("group_id", task.task_id)
        started, keep = sizes(group_size)  # over-provisioned: the first back are kept
        attempts = await first_of(lambda _: self._attempt(task, policies, group_id),
                                  started, keep, reward=_mean_reward)
        return [traj for attempt in attempts for traj in attempt]


def _mean_reward(trajectories: list[Trajectory]) -> float:
    return sum(t.reward for t in trajectories) / max(len(trajectories), 1)
