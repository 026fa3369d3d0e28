"""GRESO's per-task state lives in the data layer's store and survives a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import yaml

from astraflow.dataflow.client import DataflowClient
from astraflow.testing import wait_until
from astraflow.types import Generation
from astraflow.workflows.builder import TrajectoryBuilder

TOKEN = "greso-restart-token"


def _start(store, config) -> tuple[subprocess.Popen, str]:
    url_file = store / "url"
    url_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "dataflow", "--port", "0", "--store", str(store),
         "--config", str(config)],
        env=dict(os.environ, ASTRAFLOW_TOKEN=TOKEN), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    wait_until(url_file.exists, 60, "the data layer to start", process=proc)
    return proc, url_file.read_text().strip()


def _group(lease, rewards):
    out = []
    for reward in rewards:
        builder = TrajectoryBuilder(lease.task.task_id, lease.lease_id)
        builder.add_context([3, 4, 5])
        builder.add_generation("policy", Generation([6, 2], [-0.3, -0.1], "stop", 0))
        out.append(builder.build("policy", reward))
    return out


def _skip_state(url: str) -> dict:
    status = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    return status


def test_greso_state_survives_a_sigkill_and_restart(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path), "group_size": 4, "batch_size": 64,
        "policies": {"policy": {"max_staleness": 2}},
        "task": {"name": "arithmetic", "max_operand": 3, "ops": "+", "num_eval": 4,
                 "seed": 1},
        "data": {"greso": {"name": "greso", "floor_easy": 0.0, "floor_hard": 0.0,
                           "p_init": 0.01}},
    }))
    store = tmp_path / "store"
    proc, url = _start(store, config)
    solved: set[str] = set()
    try:
        with DataflowClient(url, TOKEN) as client:
            client.register("raas", capacity=16)
            # every task of the dataset, all-correct groups: each becomes "easy", z=1
            for lease in client.lease_tasks(max_tasks=12):
                solved.add(lease.task.metadata["source_task_id"])
                client.submit(lease, _group(lease, [1.0] * 4))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(solved) == 12  # (0..3)^2 problems minus 4 held out
    proc, url = _start(store, config)
    try:
        with DataflowClient(url, TOKEN) as client:
            client.register("raas", capacity=16)
            # with p=0.01 and no floor, a remembered task is issued with probability 0.01:
            # had the state been lost, every task would be issued again at once
            leases = client.lease_tasks(max_tasks=16)
            reissued = {lease.task.metadata["source_task_id"] for lease in leases}
            assert len(reissued) <= 4, reissued
            assert _skip_state(url)["tasks"]["skipped"] > 0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
