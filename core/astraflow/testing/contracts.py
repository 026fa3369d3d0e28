"""The contracts a task source, reward, data algorithm (task selector, trajectory filter,
batch sampler), workflow, logger or advantage estimator plugin passes, as pytest classes
a plugin's tests subclass::

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
from collections.abc import Callable
from typing import Any

import pytest
from omegaconf import OmegaConf

from astraflow.plugins import get_registry, typed_config
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


def _trajectory(task_id: str, reward: float, policy: str = "policy",
                version: int = 0) -> Trajectory:
    return Trajectory(task_id=task_id, group_id=task_id, policy=policy, tokens=[1, 2, 3, 4],
                      logprobs=[0.0, 0.0, -0.5, -0.5], loss_mask=[0, 0, 1, 1],
                      versions=[-1, -1, version, version],
                      spans=[Span(0, 2, PROMPT), Span(2, 4, policy, version)], reward=reward)


def _json_round_trip(state: Any) -> Any:
    """``state`` as the data layer stores it and reads it back after a restart."""
    return json.loads(json.dumps(state))


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


class TaskSelectorContract(_OptionContract):
    """``data=OPTION`` before rollout (a task selector): answers yes or no for every task,
    learns from finished groups, and a restarted run restores it from its JSON state to
    take the very decisions it would have taken."""

    kind = "task_selector"
    #: the tasks it is asked about (override for a selector reading their metadata)
    tasks: list[Task] = [Task(f"contract-{i}", f"{i}+1=", str(i + 1)) for i in range(6)]
    #: the reward groups it observes, task by task in turn: all right, all wrong, mixed
    groups: list[list[float]] = [[1.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 1.0]]
    policy: str = "policy"

    @pytest.fixture
    def selector(self, config: Any) -> Any:
        return self.create(config)

    def history(self, selector: Any, rounds: int = 3) -> None:
        """Several passes over the tasks, each group observed and a version published
        after each pass, as a run feeds a selector."""
        for version in range(1, rounds + 1):
            for i, task in enumerate(self.tasks):
                selector.should_issue(task)
                selector.observe_group(task, self.policy, self.groups[i % len(self.groups)])
            selector.on_new_version(self.policy, version)

    def decisions(self, selector: Any, passes: int = 20) -> list[bool]:
        return [bool(selector.should_issue(task)) for _ in range(passes) for task in self.tasks]

    def test_tasks_are_issued_yes_or_no(self, selector: Any) -> None:
        assert all(selector.should_issue(task) in (True, False) for task in self.tasks)
        self.history(selector)
        assert all(selector.should_issue(task) in (True, False) for task in self.tasks)

    def test_tasks_never_seen_are_issued(self, selector: Any) -> None:
        """Some task is issued at the start: a selector skipping every task leaves the
        rollout workers nothing to do."""
        assert any(self.decisions(selector, passes=5)), "should_issue() skipped every task"

    def test_groups_of_every_policy_are_observed(self, selector: Any) -> None:
        """A run with several policies reports each one's groups (a selector may heed
        one policy only), and keeps asking about tasks afterwards."""
        for task, rewards in zip(self.tasks, self.groups, strict=False):
            for policy in (self.policy, "verifier"):
                selector.observe_group(task, policy, list(rewards))
        assert all(selector.should_issue(task) in (True, False) for task in self.tasks)

    def test_state_survives_json_and_decides_alike(self, selector: Any, config: Any) -> None:
        for rounds in (0, 3):  # before any group, as a run restarted at once, and after
            self.history(selector, rounds)
            state = _json_round_trip(selector.state_dict())
            restored = self.create(config)
            restored.load_state_dict(state)
            assert _json_round_trip(restored.state_dict()) == state
            assert self.decisions(restored) == self.decisions(selector), (
                "a restored selector decides otherwise than the one it was saved from: "
                "state_dict() leaves out part of its state")


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


class BatchSamplerContract(_OptionContract):
    """``data=OPTION`` at batch serving (a batch sampler): composes batches the data layer
    can serve (at most ``n`` items, each once, only of those offered; full and with a
    fresh one when enough are offered) and restores from its JSON state to compose the
    same batches."""

    kind = "batch_sampler"
    #: (n, fresh offered, consumed offered): the batches it is asked for
    requests: list[tuple[int, int, int]] = [(8, 20, 20), (8, 8, 0), (8, 3, 30), (1, 5, 5),
                                            (16, 40, 2), (4, 1, 0)]
    #: the trainer's version when asked; consumed trajectories are of the versions below
    trainer_version: int = 3

    @pytest.fixture
    def sampler(self, config: Any) -> Any:
        return self.create(config)

    def offered(self, n_fresh: int, n_consumed: int) -> tuple[list[Trajectory],
                                                               list[Trajectory]]:
        fresh = [_trajectory(f"fresh-{i}", float(i % 2), version=self.trainer_version)
                 for i in range(n_fresh)]
        consumed = [_trajectory(f"consumed-{i}", float(i % 3 == 0),
                                version=i % self.trainer_version) for i in range(n_consumed)]
        return fresh, consumed

    def compose(self, sampler: Any, n: int, n_fresh: int, n_consumed: int
                ) -> tuple[list[Trajectory], list[Trajectory], list[Trajectory],
                           list[Trajectory]]:
        """(fresh picked, replayed, fresh offered, consumed offered)."""
        fresh, consumed = self.offered(n_fresh, n_consumed)
        picked, replayed = sampler.compose(n, list(fresh), list(consumed),
                                           self.trainer_version)
        return list(picked), list(replayed), fresh, consumed

    def test_batches_are_at_most_n_of_the_items_offered_each_once(self, sampler: Any
                                                                  ) -> None:
        for n, n_fresh, n_consumed in self.requests:
            picked, replayed, fresh, consumed = self.compose(sampler, n, n_fresh, n_consumed)
            request = f"compose(n={n}, {n_fresh} fresh, {n_consumed} consumed)"
            assert len(picked) + len(replayed) <= n, f"{request}: more than n items"
            # the data layer finds a pick by identity: a copy is never served
            assert {id(t) for t in picked} <= {id(t) for t in fresh}, (
                f"{request}: a fresh item not among those offered (or a copy of one)")
            assert {id(t) for t in replayed} <= {id(t) for t in consumed}, (
                f"{request}: a replayed item not among the consumed ones offered")
            assert len({id(t) for t in picked}) == len(picked), f"{request}: fresh twice"
            assert len({id(t) for t in replayed}) == len(replayed), (
                f"{request}: an item replayed twice")

    def test_enough_offered_makes_a_full_batch_with_a_fresh_item(self, sampler: Any) -> None:
        """The data layer serves a batch only when it has ``n`` items and a fresh one;
        a sampler short of that with plenty offered leaves the trainer waiting."""
        for n, n_fresh, n_consumed in self.requests:
            if n_fresh >= n:
                picked, replayed, _, _ = self.compose(sampler, n, n_fresh, n_consumed)
                assert len(picked) + len(replayed) == n and picked, (
                    f"compose(n={n}, {n_fresh} fresh, {n_consumed} consumed) gave "
                    f"{len(picked)} fresh and {len(replayed)} replayed")

    def test_state_survives_json_and_composes_alike(self, sampler: Any, config: Any) -> None:
        for n, n_fresh, n_consumed in self.requests:
            self.compose(sampler, n, n_fresh, n_consumed)
        sampler.on_new_version("policy", self.trainer_version)
        state = _json_round_trip(sampler.state_dict())
        restored = self.create(config)
        restored.load_state_dict(state)
        assert _json_round_trip(restored.state_dict()) == state
        for n, n_fresh, n_consumed in self.requests * 3:
            assert (self.picks(restored, n, n_fresh, n_consumed)
                    == self.picks(sampler, n, n_fresh, n_consumed)), (
                "a restored sampler composes otherwise than the one it was saved from: "
                "state_dict() leaves out part of its state")

    def picks(self, sampler: Any, n: int, n_fresh: int, n_consumed: int
              ) -> tuple[list[str], list[str]]:
        """The task ids of a batch: (fresh, replayed)."""
        picked, replayed, _, _ = self.compose(sampler, n, n_fresh, n_consumed)
        return [t.task_id for t in picked], [t.task_id for t in replayed]


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

        def reply(role: str) -> Callable[[str], str]:
            return lambda _: self.replies.get(role, "2")

        policies = {role: ScriptedPolicy(role, workflow.tokenizer, reply(role))
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


class AdvantageEstimatorContract(_OptionContract):
    """``policies.<name>.advantage=OPTION``: one finite advantage per sample, the same for
    the same rewards; a failed reward counts for nothing and gets 0; an agent's rollout
    counts once however many samples it yielded; the batch stage keeps the batch's shape
    and its failed samples at 0. Built as the data layer builds it (its registered
    config at its defaults)."""

    kind = "advantage_estimator"
    #: groups of rewards the checks score
    groups: list[list[float]] = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0],
                                 [0.25, 0.5, 1.0], [2.0, -1.0], [1.0], [0.5, 0.5, 0.5, 0.5]]
    #: a group whose rewards are all equal gets advantages 0 (GRPO, Dr. GRPO, RLOO,
    #: REINFORCE++: the group's baseline is its mean); False for an estimator without
    #: a group baseline
    equal_rewards_give_zero: bool = True

    @pytest.fixture
    def config(self) -> Any:
        return typed_config(get_registry().get(self.kind, self.option).config_cls, None)

    @pytest.fixture
    def estimator(self, config: Any) -> Any:
        return self.create(config)

    @staticmethod
    def scored(estimator: Any, rewards: list[float], failed: list[bool] | None = None,
               **kw: Any) -> list[float]:
        failed = failed if failed is not None else [False] * len(rewards)
        out = estimator.group_advantages(list(rewards), failed=list(failed), **kw)
        assert len(out) == len(rewards), f"{len(out)} advantages for {len(rewards)} rewards"
        assert all(isinstance(a, int | float) and math.isfinite(a) for a in out), out
        return list(out)

    def test_one_finite_advantage_per_sample(self, estimator: Any) -> None:
        for rewards in self.groups:
            self.scored(estimator, rewards)

    def test_the_same_rewards_give_the_same_advantages(self, estimator: Any,
                                                       config: Any) -> None:
        """The data layer stamps each sample once; its copies (a restart, several data
        layer processes) must agree."""
        other = self.create(config)
        for rewards in self.groups * 2:
            assert self.scored(estimator, rewards) == self.scored(other, rewards)

    def test_equal_rewards_give_zero(self, estimator: Any) -> None:
        if not self.equal_rewards_give_zero:
            pytest.skip("the estimator declares no group baseline")
        for reward in (0.0, 1.0, 0.5):
            assert self.scored(estimator, [reward] * 4) == pytest.approx([0.0] * 4, abs=1e-6)

    def test_a_failed_reward_counts_for_nothing_and_gets_zero(self, estimator: Any) -> None:
        for rewards in self.groups:
            failed = [i % 2 == 1 for i in range(len(rewards))]
            kept = [r for r, bad in zip(rewards, failed, strict=True) if not bad]
            failed = [*failed, True]
            out = self.scored(estimator, [*rewards, 7.0], failed)
            assert all(a == 0.0 for a, bad in zip(out, failed, strict=True) if bad), out
            assert [a for a, bad in zip(out, failed, strict=True) if not bad] == pytest.approx(
                self.scored(estimator, kept), abs=1e-9), (
                "a failed sample changed the others' advantages")
        assert self.scored(estimator, [1.0, 0.0], [True, True]) == [0.0, 0.0]

    def test_a_rollout_of_several_samples_counts_once(self, estimator: Any) -> None:
        """An agent's rollout yields a sample per call (its segments), each with the
        rollout's reward: the group is scored as if it yielded one."""
        rewards = [1.0, 1.0, 1.0, 0.0, 0.5]
        rollouts = ["a", "a", "a", "b", "c"]
        out = self.scored(estimator, rewards, rollouts=rollouts, rollout_rewards=rewards)
        once = self.scored(estimator, [1.0, 0.0, 0.5])
        assert out == pytest.approx([once[0]] * 3 + once[1:], abs=1e-9)

    def test_the_batch_stage_keeps_the_batch_and_its_failed_samples_at_zero(
            self, estimator: Any, config: Any) -> None:
        advantages, failed = [], []
        for rewards in self.groups:
            bad = [i == 0 for i in range(len(rewards))]
            advantages += self.scored(estimator, rewards, bad)
            failed += bad
        out = list(estimator.batch_advantages(list(advantages), failed=list(failed)))
        assert len(out) == len(advantages)
        assert all(isinstance(a, int | float) and math.isfinite(a) for a in out), out
        assert all(a == 0.0 for a, bad in zip(out, failed, strict=True) if bad), out
        again = self.create(config).batch_advantages(list(advantages), failed=list(failed))
        assert list(again) == out, "the batch stage is not deterministic"
