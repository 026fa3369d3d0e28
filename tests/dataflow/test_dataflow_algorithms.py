"""Data-algorithm plug-ins at the before-rollout and batch-serving points: when the data
layer calls them, what they receive, and that their state outlives a SIGKILL.

The algorithms (algo_plugins.py) are registered through pluggy's manager like any
installed plugin and log every hook call they receive.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import algo_plugins
import pytest
from dataflow_helpers import TOKEN, group, start_service

from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.errors import ConfigError
from astraflow.types import Task


def _submit(client: DataflowClient, lease: Any, rewards: list[float], version: int = 0) -> Any:
    tid = lease.task.task_id
    trajs = group(tid, rewards, version=version)
    for k, t in enumerate(trajs):
        t.metadata["sample"] = f"{tid}/{k}"
    return client.submit(lease, trajs)


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
        _submit(c, a, [0.0, 1.0])
        _submit(c, b, [1.0, 0.0])

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
        _submit(c, cc, [0.0, 1.0], version=2)
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


def _start(settings: dict[str, Any], port: int) -> tuple[subprocess.Popen, str]:
    return start_service([sys.executable, algo_plugins.__file__, json.dumps(settings),
                          str(port)], Path(settings["store"]) / "url")


def _sources(leases: list[Any]) -> list[str]:
    return [lease.task.metadata["source_task_id"] for lease in leases]


def test_task_selector_is_consulted_and_its_state_survives_sigkill(tmp_path):
    log = str(tmp_path / "calls.jsonl")
    settings = {
        "store": str(tmp_path / "store"), "policies": {"policy": 5}, "group_size": 2,
        "batch_size": 2,
        # three training tasks, so every lease of three starts a new epoch
        "task": {"name": "arithmetic", "max_operand": 1, "ops": "+", "num_eval": 1},
        "data": {"skip_solved": {"log": log}, "dynamic_sampling": {}},
    }
    proc, url = _start(settings, 0)
    client = DataflowClient(url, TOKEN, retry_for=30)
    try:
        client.register("raas")
        client.announce_version("policy", 1)
        client.announce_version("policy", 1)  # a repeat is no new version
        leases = client.lease_tasks(max_tasks=3)
        solved, mixed, failed = _sources(leases)
        assert _submit(client, leases[0], [1.0, 1.0], version=1)["filtered"] == 2
        assert _submit(client, leases[1], [0.0, 1.0], version=1)["accepted"] == 2
        assert _submit(client, leases[2], [0.0, 0.0], version=1)["filtered"] == 2

        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, url = _start(settings, int(url.rsplit(":", 1)[1]))

        # a node replaying an acknowledged submission observes nothing twice
        assert _submit(client, leases[0], [1.0, 1.0], version=1)["status"] == "duplicate"
        # the solved task stays skipped after the restart, the others come round again
        again = client.lease_tasks(max_tasks=2)
        assert _sources(again) == [mixed, failed]
        assert client.status()["tasks"]["skipped"] == 1
        # a new version gives it another chance
        client.announce_version("policy", 2)
        assert solved in _sources(client.lease_tasks(max_tasks=3))
    finally:
        client.close()
        proc.kill()
        proc.wait()

    calls = algo_plugins.read_log(log)
    hooks = [c["hook"] for c in calls]
    # the task source's own ids, never the ledger's per-epoch ids
    assert [(c["task_id"], c["issue"]) for c in calls if c["hook"] == "should_issue"][:3] == [
        (solved, True), (mixed, True), (failed, True)]
    # every sample's reward, also of groups the dynamic-sampling filter then dropped
    assert [(c["task_id"], c["policy"], c["rewards"]) for c in calls
            if c["hook"] == "observe_group"] == [
        (solved, "policy", [1.0, 1.0]), (mixed, "policy", [0.0, 1.0]),
        (failed, "policy", [0.0, 0.0])]
    assert [(c["policy"], c["version"]) for c in calls if c["hook"] == "on_new_version"] == [
        ("policy", 1), ("policy", 2)]
    # after the SIGKILL: exactly the state of the last acknowledged call, restored first
    restored = next(c for c in calls if c["hook"] == "load_state_dict")
    assert restored["state"] == {"solved": [solved], "versions": {"policy": 1}}
    assert hooks.index("load_state_dict") == hooks.index("observe_group") + 3
