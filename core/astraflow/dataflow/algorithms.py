"""The plugins the data layer runs: data algorithms at their three points (task
selectors before rollout, trajectory filters after it, one batch sampler at serving)
with their saved states, and each policy's advantage estimator.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any, cast

from astraflow.contracts import (
    AdvantageEstimator,
    BatchSampler,
    DataAlgorithm,
    TaskSelector,
    TrajectoryFilter,
)
from astraflow.contracts.advantage import has_batch_stage
from astraflow.dataflow.records import ServiceError
from astraflow.errors import ConfigError
from astraflow.plugins import Registry, missing_option_message, typed_config


class DataAlgorithms:
    """The run's data algorithms (``data.<name>``), by the point they act at."""

    def __init__(self, registry: Registry, configs: dict[str, Any]) -> None:
        self._algorithms: dict[str, DataAlgorithm] = {}
        options = registry.group_options("data")
        for name, conf in configs.items():
            option = options.get(name)
            if option is None:
                raise ConfigError(missing_option_message(registry, "trajectory_filter", name))
            self._algorithms[name] = option.create(typed_config(option.config_cls, conf))
        algos = self._algorithms.values()
        self.selectors = [a for a in algos if isinstance(a, TaskSelector)]
        self.filters = [a for a in algos if isinstance(a, TrajectoryFilter)]
        samplers = [name for name, a in self._algorithms.items() if isinstance(a, BatchSampler)]
        if len(samplers) > 1:
            raise ConfigError(
                f"at most one batch sampler can compose batches; got {', '.join(samplers)}: "
                "select one of them"
            )
        self.sampler: BatchSampler | None = (
            cast(BatchSampler, self._algorithms[samplers[0]]) if samplers else None)
        #: each algorithm's state as last written to the store (JSON)
        self._saved: dict[str, str] = {}

    def load(self, conn: sqlite3.Connection) -> None:
        for name, state in conn.execute("SELECT name, state FROM plugin_state"):
            if name in self._algorithms:
                self._algorithms[name].load_state_dict(json.loads(state))
                self._saved[name] = state

    def on_new_version(self, policy: str, version: int) -> None:
        for algo in self._algorithms.values():
            algo.on_new_version(policy, version)

    def updates(self) -> list[tuple[str, str]]:
        """States that changed since they were last written, as (name, JSON); from now
        on they count as written (the caller writes them with :meth:`save`)."""
        out = []
        for name, algo in self._algorithms.items():
            state = json.dumps(algo.state_dict(), sort_keys=True)
            if state != self._saved.get(name):
                self._saved[name] = state
                out.append((name, state))
        return out

    def unsaved(self, updates: list[tuple[str, str]]) -> None:
        """The states :meth:`updates` gave were not written after all (their commit
        failed): the next :meth:`updates` gives them again."""
        for name, _state in updates:
            self._saved.pop(name, None)

    @staticmethod
    def save(conn: sqlite3.Connection, updates: list[tuple[str, str]]) -> None:
        conn.executemany(
            "INSERT INTO plugin_state(name, state) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET state = excluded.state",
            updates,
        )


class Advantages:
    """Each policy's advantage estimator (``policies.<name>.advantage``), its answers
    checked: one finite number per sample."""

    def __init__(self, registry: Registry, names: dict[str, str]) -> None:
        self._names = names
        self._estimators = {p: _estimator(registry, p, name) for p, name in names.items()}
        self._batch_stage = {p: has_batch_stage(e) for p, e in self._estimators.items()}

    def has_batch_stage(self, policy: str) -> bool:
        return self._batch_stage[policy]

    def group(self, policy: str, rewards: list[float], failed: list[bool],
              rollouts: list[Any] | None, rollout_rewards: list[float]) -> list[float]:
        """One advantage per member of a group (an agent's segments name their rollout)."""
        out = self._estimators[policy].group_advantages(
            rewards, failed=failed, rollouts=rollouts, rollout_rewards=rollout_rewards)
        return self._checked(policy, out, len(rewards), "group")

    def batch(self, policy: str, advantages: list[float], failed: list[bool]) -> list[float]:
        """A batch's advantages through the batch stage (REINFORCE++'s normalisation)."""
        out = self._estimators[policy].batch_advantages(advantages, failed=failed)
        return self._checked(policy, out, len(advantages), "batch")

    def _checked(self, policy: str, out: Sequence[float], n: int, of: str) -> list[float]:
        if len(out) != n or not all(map(math.isfinite, out)):
            raise ServiceError(500, (
                f"the advantage estimator of policy {policy!r} ({self._names[policy]}) "
                f"returned {list(out)!r} for a {of} of {n}: one finite number per sample "
                "expected"))
        return [float(a) for a in out]


def _estimator(registry: Registry, policy: str, name: str) -> AdvantageEstimator:
    """``policy``'s advantage estimator, built with its registered config's defaults."""
    entries = registry.entries["advantage_estimator"]
    if name not in entries:
        raise ConfigError(missing_option_message(registry, "advantage_estimator", name,
                                                 key=f"policies.{policy}.advantage"))
    entry = entries[name]
    estimator: AdvantageEstimator = entry.create(typed_config(entry.config_cls, None))
    return estimator
