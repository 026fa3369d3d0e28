"""Replay's ratio, selection rules and staleness bound."""

from __future__ import annotations

import pytest
from astraflow_data_replay import ReplayConfig
from astraflow_data_replay.replay import Replay

from astraflow.errors import ConfigError
from astraflow.types import Span, Trajectory


def traj(i: int, version: int = 0, reward: float = 0.0) -> Trajectory:
    return Trajectory(f"t{i}", f"g{i}", "policy", [1, 2], [0.0, -1.0], [0, 1], [-1, version],
                      [Span(0, 1, "prompt"), Span(1, 2, "policy", version)], reward)


def test_replay_ratio_of_the_batch_comes_from_consumed():
    fresh = [traj(i) for i in range(40)]
    consumed = [traj(100 + i) for i in range(40)]
    new, old = Replay(ReplayConfig(replay_ratio=0.25)).compose(16, fresh, consumed, 0)
    assert (len(new), len(old)) == (12, 4)
    assert new == fresh[:12] and set(map(id, old)) <= set(map(id, consumed))


def test_without_enough_consumed_the_batch_is_filled_fresh():
    fresh = [traj(i) for i in range(20)]
    new, old = Replay(ReplayConfig(replay_ratio=0.5)).compose(10, fresh, [traj(99)], 0)
    assert (len(new), len(old)) == (9, 1)


def test_selection_rules():
    consumed = [traj(i, version=i, reward=float(i % 5)) for i in range(10)]
    fresh = [traj(100 + i) for i in range(10)]
    _, latest = Replay(ReplayConfig(replay_ratio=0.3, selection="latest")).compose(
        10, fresh, consumed, 9)
    assert [t.min_version for t in latest] == [9, 8, 7]
    _, best = Replay(ReplayConfig(replay_ratio=0.2, selection="reward")).compose(
        10, fresh, consumed, 9)
    assert [t.reward for t in best] == [4.0, 4.0]
    picks = set()
    for seed in range(20):
        _, uni = Replay(ReplayConfig(replay_ratio=0.2, seed=seed)).compose(10, fresh, consumed, 9)
        picks.update(t.task_id for t in uni)
    assert len(picks) > 5  # uniform reaches across the pool


def test_staleness_bound_applies_to_replayed_samples():
    consumed = [traj(i, version=i) for i in range(10)]
    fresh = [traj(100 + i, version=10) for i in range(10)]
    _, old = Replay(ReplayConfig(replay_ratio=0.5, max_staleness=2)).compose(
        10, fresh, consumed, 10)
    assert old and all(10 - t.min_version <= 2 for t in old)
    assert len(old) == 2  # only versions 8 and 9 qualify


def test_a_batch_always_has_a_fresh_sample():
    with pytest.raises(ConfigError):
        Replay(ReplayConfig(replay_ratio=1.0))
    new, old = Replay(ReplayConfig(replay_ratio=0.9)).compose(
        2, [traj(1), traj(2)], [traj(3), traj(4)], 0)
    assert len(new) == 1 and len(old) == 1


def test_unknown_selection_is_a_clear_error():
    with pytest.raises(ConfigError, match="latest, uniform, reward"):
        Replay(ReplayConfig(selection="best"))
