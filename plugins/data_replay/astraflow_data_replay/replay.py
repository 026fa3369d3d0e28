"""Replay: part of each batch comes from trajectories already trained on.

Reusing rollouts trades some on-policyness for fewer generations; the staleness bound
keeps replayed samples from drifting too far from the policy being trained (a check
the reference system skips).
"""

from __future__ import annotations

import random
from typing import Any

from astraflow.contracts import BatchSampler
from astraflow.errors import ConfigError
from astraflow.types import Trajectory
from astraflow_data_replay import SELECTIONS


class Replay(BatchSampler):
    def __init__(self, config: Any = None) -> None:
        from astraflow_data_replay import ReplayConfig

        super().__init__(config if config is not None else ReplayConfig())
        if self.config.selection not in SELECTIONS:
            raise ConfigError(f"data.replay.selection={self.config.selection!r}; "
                              f"choose one of {', '.join(SELECTIONS)}")
        if not 0.0 <= self.config.replay_ratio < 1.0:
            raise ConfigError("data.replay.replay_ratio must be in [0, 1): a batch needs "
                              "at least one fresh trajectory")
        self.rng = random.Random(self.config.seed)

    def _eligible(self, consumed: list[Trajectory], trainer_version: int) -> list[Trajectory]:
        bound = self.config.max_staleness
        if bound is None:
            return list(consumed)
        return [t for t in consumed if trainer_version - t.min_version <= bound]

    def _choose(self, pool: list[Trajectory], k: int) -> list[Trajectory]:
        if k <= 0 or not pool:
            return []
        k = min(k, len(pool))
        selection = self.config.selection
        if selection == "latest":
            return sorted(pool, key=lambda t: t.min_version, reverse=True)[:k]
        if selection == "uniform":
            return self.rng.sample(pool, k)
        shuffled = self.rng.sample(pool, len(pool))
        return sorted(shuffled, key=lambda t: t.reward, reverse=True)[:k]

    def compose(self, n: int, fresh: list[Trajectory], consumed: list[Trajectory],
                trainer_version: int) -> tuple[list[Trajectory], list[Trajectory]]:
        want = min(round(n * self.config.replay_ratio), n - 1)
        replayed = self._choose(self._eligible(consumed, trainer_version), want)
        return list(fresh[: n - len(replayed)]), replayed

    def state_dict(self) -> dict[str, Any]:
        return {"rng": list(self.rng.getstate()[1])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rng"):
            self.rng.setstate((3, tuple(state["rng"]), None))
