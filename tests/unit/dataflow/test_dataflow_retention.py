"""Retention: done tasks, acknowledged batches and departed rollout nodes are remembered
for ``retain_seconds`` -- a late duplicate is answered "duplicate" meanwhile -- and then
leave memory and the store, so a run of days keeps both bounded."""

from __future__ import annotations

import sqlite3

import pytest
from dataflow_helpers import TOKEN, submit_group, wait_until

from astraflow.dataflow.client import DataflowClient, DataflowError
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.types import Task


def _rows(store, sql: str) -> int:
    conn = sqlite3.connect(store / "dataflow.sqlite3")
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def test_what_is_done_is_remembered_for_a_while_then_forgotten(tmp_path):
    store = tmp_path / "store"
    settings = DataflowSettings(store=str(store), group_size=2, batch_size=2,
                                retain_seconds=1.5, heartbeat_timeout=0.6)
    with BackgroundServer(settings, TOKEN) as server:
        c = DataflowClient(server.url, TOKEN, retry_for=0)
        c.register("raas", node_id="leaving")
        c.register("raas", node_id="staying")
        c.post_tasks([Task(f"t{i}", "p") for i in range(4)])
        leases = c.lease_tasks("leaving", max_tasks=4)
        for lease in leases:
            submit_group(c, lease, [0.0, 1.0])
        batches = []
        for _ in range(2):
            batches.append(batch := c.get_batch("policy", 2, timeout=1))
            c.ack_batch(batch.batch_id)
            # sent again at once: a duplicate, not an error
            assert c.ack_batch(batch.batch_id)["status"] == "duplicate"
        c.leave("leaving")
        # within retain_seconds a late duplicate is still recognised
        assert submit_group(c, leases[0], [1.0, 1.0])["status"] == "duplicate"
        st = c.status()["retention"]
        assert (st["tasks_remembered"], st["batches_remembered"]) == (4, 2)

        def forgotten():
            c.heartbeat("staying")
            return c.status()["retention"]["tasks_forgotten"] == 4

        wait_until(forgotten, 10, "the done tasks to be forgotten")
        st = c.status()
        assert st["retention"] == {"seconds": 1.5, "tasks_remembered": 0,
                                   "batches_remembered": 0, "tasks_forgotten": 4,
                                   "batches_forgotten": 2, "nodes_forgotten": 1}
        assert [n["node_id"] for n in st["nodes"]] == ["staying"]
        # past it, a duplicate is refused as unknown, saying why
        with pytest.raises(DataflowError, match="done longer ago than retain_seconds") as late:
            submit_group(c, leases[0], [1.0, 1.0])
        assert late.value.status == 404
        with pytest.raises(DataflowError) as late_ack:
            c.ack_batch(batches[0].batch_id)
        assert late_ack.value.status == 404
        c.close()
    # and the store holds none of them
    assert _rows(store, "SELECT count(*) FROM tasks WHERE state = 'done'") == 0
    assert _rows(store, "SELECT count(*) FROM batches") == 0
    assert _rows(store, "SELECT count(*) FROM nodes WHERE node_id = 'leaving'") == 0
