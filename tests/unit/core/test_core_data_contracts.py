"""The task-selector and batch-sampler contracts pass a sound algorithm and catch the
mistakes a plugin author makes: a selector that skips everything, answers None or
forgets its state on restart; a sampler that overfills a batch, serves copies or the
same item twice, starves the trainer, or replays differently after a restart."""

from __future__ import annotations

import dataclasses
import inspect
import random
from typing import Any

import pytest

from astraflow.contracts import BatchSampler, TaskSelector
from astraflow.plugins import Entry, get_registry
from astraflow.testing.contracts import BatchSamplerContract, TaskSelectorContract
from astraflow.types import Task, Trajectory

OPTION = "contract_under_test"


class Solved(TaskSelector):
    """Skips a task whose last group was all right, and re-issues one in five of them at
    random: its state is the solved tasks and the generator's."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.solved: set[str] = set()
        self.rng = random.Random(0)

    def should_issue(self, task: Task) -> bool:
        return task.task_id not in self.solved or self.rng.random() < 0.2

    def observe_group(self, task: Task, policy: str, rewards: list[float]) -> None:
        if min(rewards) == 1.0:
            self.solved.add(task.task_id)
        else:
            self.solved.discard(task.task_id)

    def state_dict(self) -> dict[str, Any]:
        return {"solved": sorted(self.solved), "rng": list(self.rng.getstate()[1])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.solved = set(state["solved"])
        self.rng.setstate((3, tuple(state["rng"]), None))


class ForgetsTheSolved(Solved):
    def state_dict(self) -> dict[str, Any]:
        return {"rng": list(self.rng.getstate()[1])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate((3, tuple(state["rng"]), None))


class ForgetsTheGenerator(Solved):
    def state_dict(self) -> dict[str, Any]:
        return {"solved": sorted(self.solved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.solved = set(state["solved"])


class SkipsEverything(Solved):
    def should_issue(self, task: Task) -> bool:
        return False


class AnswersNothing(Solved):
    def should_issue(self, task: Task) -> bool:  # the return forgotten
        super().should_issue(task)


class Replays(BatchSampler):
    """A quarter of each batch replayed, chosen at random: its state is the generator's."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.rng = random.Random(0)

    def compose(self, n: int, fresh: list[Trajectory], consumed: list[Trajectory],
                trainer_version: int) -> tuple[list[Trajectory], list[Trajectory]]:
        replayed = self.rng.sample(consumed, min(len(consumed), n // 4))
        return fresh[:n - len(replayed)], replayed

    def state_dict(self) -> dict[str, Any]:
        return {"rng": list(self.rng.getstate()[1])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate((3, tuple(state["rng"]), None))


class Overfills(Replays):
    def compose(self, n, fresh, consumed, trainer_version):
        return fresh[:n], consumed[:1]


class ServesCopies(Replays):
    def compose(self, n, fresh, consumed, trainer_version):
        picked, replayed = super().compose(n, fresh, consumed, trainer_version)
        return [dataclasses.replace(t) for t in picked], replayed


class ServesOneTwice(Replays):
    def compose(self, n, fresh, consumed, trainer_version):
        return fresh[:1] * min(n, len(fresh)), []


class OnlyReplays(Replays):
    def compose(self, n, fresh, consumed, trainer_version):
        return [], consumed[:n]


class ForgetsItsGenerator(Replays):
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def failures(contract: type, impl: type, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The checks of ``contract`` that ``impl`` fails, registered as an option, each
    with a fresh instance as its fixture."""
    entry = Entry(contract.kind, OPTION, impl, None, "tests", "tests", "0",
                  description="An algorithm the contract's own tests judge.")
    monkeypatch.setitem(get_registry().entries[contract.kind], OPTION, entry)
    suite = type("Suite", (contract,), {"option": OPTION})()
    failed = set()
    for name, check in inspect.getmembers(suite, inspect.ismethod):
        if not name.startswith("test_"):
            continue
        fixtures = {p: None if p == "config" else suite.create(None)
                    for p in inspect.signature(check).parameters}
        try:
            check(**fixtures)
        except Exception:  # a failed assertion, or what the algorithm raised
            failed.add(name.removeprefix("test_"))
    return failed


@pytest.mark.parametrize(("impl", "caught"), [
    (Solved, set()),
    (ForgetsTheSolved, {"state_survives_json_and_decides_alike"}),
    (ForgetsTheGenerator, {"state_survives_json_and_decides_alike"}),
    (SkipsEverything, {"tasks_never_seen_are_issued"}),
    (AnswersNothing, {"tasks_are_issued_yes_or_no", "tasks_never_seen_are_issued",
                      "groups_of_every_policy_are_observed"}),
])
def test_the_task_selector_contract(impl, caught, monkeypatch):
    assert failures(TaskSelectorContract, impl, monkeypatch) == caught


@pytest.mark.parametrize(("impl", "caught"), [
    (Replays, set()),
    (Overfills, {"batches_are_at_most_n_of_the_items_offered_each_once",
                 "enough_offered_makes_a_full_batch_with_a_fresh_item"}),
    (ServesCopies, {"batches_are_at_most_n_of_the_items_offered_each_once"}),
    (ServesOneTwice, {"batches_are_at_most_n_of_the_items_offered_each_once"}),
    (OnlyReplays, {"enough_offered_makes_a_full_batch_with_a_fresh_item"}),
    (ForgetsItsGenerator, {"state_survives_json_and_composes_alike"}),
])
def test_the_batch_sampler_contract(impl, caught, monkeypatch):
    assert failures(BatchSamplerContract, impl, monkeypatch) == caught
