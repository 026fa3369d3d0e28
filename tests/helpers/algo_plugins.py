"""Data algorithms written the way a third party would, registered through pluggy.

Each appends every hook call it receives to a JSON-lines log (``log`` in its config),
so the tests can see what the data layer called, when and with what -- across
processes and a SIGKILL.

Run as a script it serves the data layer with these plugins registered:
``python algo_plugins.py SETTINGS_JSON PORT`` (token from ``ASTRAFLOW_TOKEN``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from astraflow import hookimpl
from astraflow.contracts import BatchSampler, TaskSelector
from astraflow.plugins import Registry, get_plugin_manager
from astraflow.types import Task, Trajectory


def read_log(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f]


class _Logged:
    config: Any

    def _log(self, hook: str, **data: Any) -> None:
        with open(self.config.log, "a") as f:
            f.write(json.dumps({"hook": hook, **data}) + "\n")


@dataclass
class SkipSolvedConfig:
    name: str = "skip_solved"
    log: str = ""


class SkipSolved(_Logged, TaskSelector):
    """Skips a task once a group of it scored all 1.0; a new weight version gives every
    skipped task another chance (GRESO's rule, reduced to its bones)."""

    def __init__(self, config: SkipSolvedConfig) -> None:
        super().__init__(config)
        self.solved: set[str] = set()
        self.versions: dict[str, int] = {}

    def should_issue(self, task: Task) -> bool:
        issue = task.task_id not in self.solved
        self._log("should_issue", task_id=task.task_id, issue=issue)
        return issue

    def observe_group(self, task: Task, policy: str, rewards: list[float]) -> None:
        self._log("observe_group", task_id=task.task_id, policy=policy, rewards=rewards)
        if rewards and min(rewards) == 1.0:
            self.solved.add(task.task_id)

    def on_new_version(self, policy: str, version: int) -> None:
        self._log("on_new_version", policy=policy, version=version)
        self.versions[policy] = version
        self.solved.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"solved": sorted(self.solved), "versions": self.versions}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._log("load_state_dict", state=state)
        self.solved = set(state["solved"])
        self.versions = dict(state["versions"])


@dataclass
class ReplayConfig:
    name: str = "replay_newest"
    #: replayed trajectories per batch, at most
    replay: int = 1
    log: str = ""


class ReplayNewest(_Logged, BatchSampler):
    """Fills up to ``replay`` places of each batch with the most recently consumed items."""

    def __init__(self, config: ReplayConfig) -> None:
        super().__init__(config)
        self.replayed = 0

    def compose(self, n: int, fresh: list[Trajectory], consumed: list[Trajectory],
                trainer_version: int) -> tuple[list[Trajectory], list[Trajectory]]:
        self._log("compose", n=n, trainer_version=trainer_version,
                  fresh=[t.metadata["sample"] for t in fresh],
                  consumed=[t.metadata["sample"] for t in consumed])
        replay = consumed[::-1][: min(self.config.replay, n - 1)]
        self.replayed += len(replay)
        return fresh[: n - len(replay)], replay

    def state_dict(self) -> dict[str, Any]:
        return {"replayed": self.replayed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replayed = state["replayed"]


class DataAlgorithmsPlugin:
    """The plugin object: the same hooks an installed ``astraflow`` entry point implements."""

    @hookimpl
    def astraflow_register_task_selectors(self, register):
        register("skip_solved", SkipSolved, SkipSolvedConfig)

    @hookimpl
    def astraflow_register_batch_samplers(self, register):
        register("replay_newest", ReplayNewest, ReplayConfig)
        register("replay_also", ReplayNewest, ReplayConfig)


def registry() -> Registry:
    """The installed plugins plus :class:`DataAlgorithmsPlugin`, registered on pluggy's manager."""
    manager = get_plugin_manager()
    manager.register(DataAlgorithmsPlugin(), name="test-data-algorithms")
    return manager.build_registry()


if __name__ == "__main__":
    from astraflow.dataflow.server import serve
    from astraflow.dataflow.settings import DataflowSettings

    serve(DataflowSettings(**json.loads(sys.argv[1])), "127.0.0.1", int(sys.argv[2]),
          os.environ["ASTRAFLOW_TOKEN"], registry=registry())
