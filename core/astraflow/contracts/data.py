"""Data algorithms: plug-ins at the three intervention points of the data path.

Each sees full trajectory content and metadata, keeps its own state and
checkpoints it through ``state_dict``/``load_state_dict`` (JSON-serialisable; the
data layer persists it in its store).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from astraflow.types import Task, Trajectory


class DataAlgorithm:
    """Common base: configuration, state and version notifications."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def on_new_version(self, policy: str, version: int) -> None:
        """A trainer published ``version`` of ``policy``."""


class TaskSelector(DataAlgorithm, ABC):
    """Before rollout: decide whether a candidate task is issued now."""

    @abstractmethod
    def should_issue(self, task: Task) -> bool:
        """False skips the task this pass (it stays in the dataset)."""

    def observe_group(self, task: Task, policy: str, rewards: list[float]) -> None:
        """Rewards of a completed group for ``task`` (all samples, before filtering)."""


class TrajectoryFilter(DataAlgorithm, ABC):
    """After rollout: keep or drop a completed group of one policy."""

    @abstractmethod
    def keep(self, group: list[Trajectory]) -> bool:
        """False drops the whole group (counted as filtered, never lost silently)."""


class BatchSampler(DataAlgorithm, ABC):
    """At batch serving: compose a batch from fresh and already-consumed trajectories."""

    @abstractmethod
    def compose(
        self, n: int, fresh: list[Trajectory], consumed: list[Trajectory], trainer_version: int
    ) -> tuple[list[Trajectory], list[Trajectory]]:
        """Return (fresh items to serve, replayed items to serve), at most ``n`` in all.

        ``fresh`` are eligible unconsumed trajectories in serving order; ``consumed``
        are eligible trajectories already trained on (already staleness-checked).
        """
