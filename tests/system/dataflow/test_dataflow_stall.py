"""The data layer stopped (SIGSTOP: a hang, or its machine stalled) for longer than the
heartbeat timeout and the lease: when it runs again, the nodes that could not reach it
meanwhile are not retired for it and their leases still stand -- the node hands in what
it rolled out, and nothing is re-issued to another node."""

from __future__ import annotations

import os
import signal
import sys
import time

from dataflow_helpers import TOKEN, group, start_service

from astraflow.dataflow.client import DataflowClient
from astraflow.types import Task

HEARTBEAT, LEASE, STOPPED = 2.0, 3.0, 6.0


def test_a_stopped_data_layer_holds_its_absence_against_no_node(tmp_path):
    store = tmp_path / "store"
    proc, url = start_service(
        [sys.executable, "-m", "astraflow", "dataflow", "--port", "0", "--store", str(store),
         "--group-size", "2", "--batch-size", "2", "--policy", "policy=100",
         "--heartbeat-timeout", str(HEARTBEAT), "--lease-seconds", str(LEASE)], store / "url")
    try:
        with DataflowClient(url, TOKEN, retry_for=30) as node, \
                DataflowClient(url, TOKEN, retry_for=30) as other:
            node.register("raas", node_id="node-1")
            other.register("raas", node_id="node-2")
            node.post_tasks([Task("t0", "p")])
            (lease,) = node.lease_tasks(max_tasks=1)
            node.heartbeat()
            os.kill(proc.pid, signal.SIGSTOP)  # the fault: the data layer hangs for 6 s
            time.sleep(STOPPED)
            os.kill(proc.pid, signal.SIGCONT)
            # the other node asks for work at once: the lease must still be node-1's
            assert other.lease_tasks(max_tasks=1, wait=0) == []
            out = node.submit(lease, group("t0", [0.0, 1.0]))
            assert out["status"] == "accepted", out
            status = node.status()
        states = {n["node_id"]: n["state"] for n in status["nodes"]}
        assert states == {"node-1": "active", "node-2": "active"}, states
        assert status["stalls"] == 1
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)
