"""A task selector's state survives a SIGKILL of the data layer that consults it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import algo_plugins
from dataflow_helpers import TOKEN, start_service, submit_group

from astraflow.dataflow.client import DataflowClient


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
        assert submit_group(client, leases[0], [1.0, 1.0], version=1)["filtered"] == 2
        assert submit_group(client, leases[1], [0.0, 1.0], version=1)["accepted"] == 2
        assert submit_group(client, leases[2], [0.0, 0.0], version=1)["filtered"] == 2

        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, url = _start(settings, int(url.rsplit(":", 1)[1]))

        # a node replaying an acknowledged submission observes nothing twice
        assert submit_group(client, leases[0], [1.0, 1.0], version=1)["status"] == "duplicate"
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
