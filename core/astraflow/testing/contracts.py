"""The contracts a task source, reward, data algorithm (trajectory filter), workflow or
logger plugin passes, as pytest classes a plugin's tests subclass::

    from astraflow.testing.contracts import RewardContract

    class TestMyReward(RewardContract):
        option = "my_reward"
        cases = [(Task("t", "1+1=", "2"), "2", 1.0)]

Each builds the option through the plugin registry with its config as a run passes it
(an OmegaConf node), so it checks exactly what ``GROUP=OPTION`` selects. Rollout and
trainer backends have theirs in :mod:`astraflow.testing.rollout` and
:mod:`astraflow.testing.trainer`.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.types import PROMPT, Span, Task, Trajectory


class _OptionContract:
    #: the option's name (``GROUP=option``)
    option: str = ""
    #: the registry kind it is registered as
    kind: str = ""
    #: settings over the option's defaults
    settings: dict[str, Any] = {}

    @pytest.fixture
    def config(self) -> Any:
        entry = get_registry().get(self.kind, self.option)
        if entry.config_cls is None:
            return None
        return OmegaConf.merge(OmegaConf.structured(entry.config_cls), self.settings)

    def create(self, *args: Any) -> Any:
        return get_registry().get(self.kind, self.option).create(*args)

    def test_the_option_is_registered_with_a_description(self) -> None:
        entry = get_registry().get(self.kind, self.option)
        assert entry.name == self.option
        assert entry.description, "register(..., description=...) is shown by --help"


def _trajectory(task_id: str, reward: float, policy: str = "policy") -> Trajectory:
    return Trajectory(task_id=task_id, group_id=task_id, policy=policy, tokens=[1, 2, 3, 4],
                      logprobs=[0.0, 0.0, -0.5, -0.5], loss_mask=[0, 0, 1, 1],
                      versions=[-1, -1, 0, 0],
                      spans=[Span(0, 2, PROMPT), Span(2, 4, policy, 0)], reward=reward)


class TaskSourceContract(_OptionContract):
    """``task=OPTION``: tasks with unique ids and a prompt, that cross processes intact."""

    kind = "task"
    #: training tasks read by the checks (a source may be endless)
    sample: int = 50

    @pytest.fixture
    def source(self, config: Any) -> Any:
        return self.create(config)

    def test_training_tasks_have_unique_ids_and_prompts(self, source: Any) -> None:
        tasks = [t for _, t in zip(range(self.sample), source.train_tasks(), strict=False)]
        assert tasks, "train_tasks() yielded nothing"
        assert all(isinstance(t, Task) and t.task_id and t.prompt for t in tasks)
        assert len({t.task_id for t in tasks}) == len(tasks)

    def test_held_out_tasks_are_tasks_apart_from_training(self, source: Any) -> None:
        held_out = source.eval_tasks()
        assert all(isinstance(t, Task) and t.prompt for t in held_out)
        train = {t.task_id for _, t in zip(range(self.sample), source.train_tasks(),
                                           strict=False)}
        assert not train & {t.task_id for t in held_out}

    def test_tasks_survive_json(self, source: Any) -> None:
        task = next(iter(source.train_tasks()))
        again = Task(**json.loads(json.dumps(task.__dict__)))
        assert again == task


class RewardContract(_OptionContract):
    """``reward=OPTION``: a score in [0, 1] (or a dict with one), plain or async."""

    kind = "reward"
    #: (task, completion, expected score) the reward must give
    cases: list[tuple[Task, str, float]] = []

    @pytest.fixture
    def reward(self, config: Any) -> Any:
        return self.create(config)

    @staticmethod
    def score(reward: Any, task: Task, completion: str) -> float:
        value = reward(task, completion)
        if asyncio.iscoroutine(value):
            value = asyncio.run(value)
        if isinstance(value, dict):
            value = value["score"]
        assert isinstance(value, int | float) and math.isfinite(value), value
        return float(value)

    def test_a_score_is_a_finite_number(self, reward: Any) -> None:
        task = Task("contract-0", "1+1=", "2")
        for completion in ("2", "3", "", "a long answer " * 50):
            assert 0.0 <= self.score(reward, task, completion) <= 1.0

    def test_the_cases_score_as_expected(self, reward: Any) -> None:
        for task, completion, expected in self.cases:
            assert self.score(reward, task, completion) == pytest.approx(expected), completion


class TrajectoryFilterContract(_OptionContract):
    """``data=OPTION`` (a trajectory filter): judges groups, keeps state the data layer
    can save as JSON and restore."""

    kind = "trajectory_filter"

    @pytest.fixture
    def algorithm(self, config: Any) -> Any:
        return self.create(config)

    def test_groups_are_judged_yes_or_no(self, algorithm: Any) -> None:
        for rewards in ([0.0, 1.0, 0.0, 1.0], [1.0] * 4, [0.0] * 4):
            group = [_trajectory("t", r) for r in rewards]
            assert algorithm.keep(group) in (True, False)

    def test_state_survives_json(self, algorithm: Any, config: Any) -> None:
        algorithm.keep([_trajectory("t", r) for r in (0.0, 1.0)])
        state = json.loads(json.dumps(algorithm.state_dict()))
        other = self.create(config)
        other.load_state_dict(state)
        assert json.loads(json.dumps(other.state_dict())) == state


class WorkflowContract(_OptionContract):
    """``workflow=OPTION``: turns a task into valid trajectories of its roles, in the
    task's group, training each policy on its own tokens only."""

    kind = "workflow"
    #: what each role answers every prompt with (ScriptedPolicy); a role not named
    #: answers "2"
    replies: dict[str, str] = {}
    group_size: int = 2

    @pytest.fixture
    def workflow(self, config: Any, tiny_model_dir: str) -> Any:
        from astraflow.text import load_tokenizer

        entry = get_registry().get("reward", "exact_match")
        reward = entry.create(OmegaConf.structured(entry.config_cls))
        return self.create(config, load_tokenizer(tiny_model_dir), reward)

    def test_a_task_becomes_valid_trajectories_of_its_roles(self, workflow: Any,
                                                            config: Any) -> None:
        from astraflow.testing.scripted import ScriptedPolicy

        roles = type(workflow).roles_for(config)
        policies = {role: ScriptedPolicy(role, workflow.tokenizer,
                                         lambda _, r=role: self.replies.get(r, "2"))
                    for role in roles}
        task = Task("contract-1", "1+1=", "2", metadata={"group_id": "g1"})
        trajs = asyncio.run(workflow.run(task, policies, self.group_size))
        assert trajs, "run() returned no trajectory"
        for traj in trajs:
            traj.validate()
            assert traj.policy in roles
            assert traj.group_id == "g1"
            for span in traj.spans:  # only the trajectory's own policy's tokens train
                assert set(traj.loss_mask[span.start:span.end]) <= {
                    int(span.source == traj.policy)}
            assert sum(traj.loss_mask) > 0


class LoggerContract(_OptionContract):
    """``logger=OPTION``: takes a run's records while it runs and closes cleanly."""

    kind = "logger"

    def test_records_are_logged_and_the_logger_closes(self, config: Any, tmp_path) -> None:
        logger = self.create(config, str(tmp_path), {"steps": 2})
        logger.log([{"kind": "train", "policy": "policy", "step": s, "time": 1.0 + s,
                     "reward_mean": 0.5} for s in (1, 2)])
        logger.log([{"kind": "eval", "policy": "policy", "version": 2, "time": 4.0,
                     "eval_accuracy": 0.25},
                    {"kind": "launcher", "event": "restart", "time": 5.0}])
        logger.close()
