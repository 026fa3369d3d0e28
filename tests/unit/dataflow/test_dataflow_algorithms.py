"""Data-algorithm plug-ins at the before-rollout and batch-serving points: when the data
layer calls them, what they receive, and that their state outlives a SIGKILL.

The algorithms (algo_plugins.py) are registered through pluggy's manager like any
installed plugin and log every hook call they receive.
"""

from __future__ import annotations

from typing import Any

import algo_plugins
import pytest
from dataflow_helpers import TOKEN, submit_group

from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.errors import ConfigError
from astraflow.types import Task


def _samples(batch: Any) -> list[str]:
    return [i.trajectory.metadata["sample"] for i in batch.items]


def test_batch_sampler_mixes_fresh_and_replayed_trajectories(tmp_path, connect):
    log = str(tmp_path / "calls.jsonl")
    # batch_size 4 lets admission control issue all three tasks at once
    settings = DataflowSettings(store=str(tmp_path / "store"), policies={"policy": 1},
                                group_size=2, batch_size=4,
                                data={"replay_newest": {"replay": 1, "log": log}})
    with BackgroundServer(settings, TOKEN, registry=algo_plugins.registry()) as server:
        c = connect(server)
        c.register("raas")
        c.post_tasks([Task(t, "p") for t in "abc"])
        a, b, cc = c.lease_tasks(max_tasks=3)
        submit_group(c, a, [0.0, 1.0])
        submit_group(c, b, [1.0, 0.0])

        first = c.get_batch("policy", 2, timeout=1)
        assert _samples(first) == ["a/0", "a/1"] and first.metadata["replayed"] == 0
        c.ack_batch(first.batch_id)
        # the newest consumed trajectory fills one place; it keeps its advantage
        second = c.get_batch("policy", 2, timeout=1)
        assert _samples(second) == ["b/0", "a/1"] and second.metadata["replayed"] == 1
        assert [round(i.advantage, 3) for i in second.items] == [1.0, 1.0]
        c.ack_batch(second.batch_id)
        st = c.status()["policies"]["policy"]
        assert (st["consumed"], st["replayed"], st["buffered"], st["replayable"]) == (3, 1, 1, 3)

        # version 2 makes everything from version 0 stale (max_staleness 1): the fresh
        # b/1 is dropped and nothing stale is ever offered for replay either
        assert c.announce_version("policy", 2)["dropped_stale"] == 1
        assert c.status()["policies"]["policy"]["replayable"] == 0
        submit_group(c, cc, [0.0, 1.0], version=2)
        third = c.get_batch("policy", 2, timeout=1)
        assert _samples(third) == ["c/0", "c/1"] and third.metadata["replayed"] == 0

    calls = [(x["n"], x["trainer_version"], x["fresh"], x["consumed"])
             for x in algo_plugins.read_log(log) if x["hook"] == "compose"]
    assert calls == [
        (2, 0, ["a/0", "a/1", "b/0", "b/1"], []),
        (2, 0, ["b/0", "b/1"], ["a/0", "a/1"]),
        (2, 2, ["c/0", "c/1"], []),
    ]


def test_more_than_one_batch_sampler_is_refused(tmp_path):
    settings = DataflowSettings(store=str(tmp_path / "store"),
                                data={"replay_newest": {}, "replay_also": {}})
    with pytest.raises(ConfigError, match=r"at most one batch sampler.*replay_newest, replay_also"):
        BackgroundServer(settings, TOKEN, registry=algo_plugins.registry())
