"""The autoscale report: the dead-band rule, fed by trainer step reports and production."""

from __future__ import annotations

import math

from dataflow_helpers import group

from astraflow.dataflow.autoscale import dead_band_target


def test_dead_band_rule():
    assert dead_band_target(4, 0.5, 10, 10) == 8  # ceil(4 / (1 - 0.5))
    assert dead_band_target(4, 0.99, 10, 10) == 80  # f capped at 0.95
    assert dead_band_target(4, 0.07, 1, 100) == 4  # inside the band: hold
    assert dead_band_target(10, 0.0, 50, 100) == 6  # ceil(10 * 0.5 * 1.1)
    assert dead_band_target(10, 0.0, 100, 50) == 10  # never grows when not waiting
    assert dead_band_target(3, 0.0, 0, 0) == 3  # nothing produced: hold


def test_report_grows_a_pool_whose_trainer_waits(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=2)
    nodes = [connect(server) for _ in range(2)]
    for node in nodes:
        node.register("raas", pool="cpu")
    trainer = connect(server)
    trainer.register("trainer", policies=["policy"])
    assert trainer.autoscale()["pools"]["cpu"]["action"] == "hold"
    for node in nodes:
        for lease in node.lease_tasks(max_tasks=2):
            node.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    for _ in range(2):
        batch = trainer.get_batch("policy", 4, timeout=1)
        trainer.ack_batch(batch.batch_id, wait_seconds=0.6, step_seconds=1.0)
    report = trainer.autoscale()
    assert report["wait_fraction"] == 0.6
    assert (report["produced"], report["consumed"]) == (8, 8)
    assert report["pools"]["cpu"] | {"reason": ""} == {
        "size": 2, "produced": 8, "target": 5, "action": "grow", "reason": ""}
    # trainers hardly waiting: the shrink branch, sized to consumption (10 of 16 produced)
    for node in nodes:
        for lease in node.lease_tasks(max_tasks=2):
            node.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    batch = trainer.get_batch("policy", 2, timeout=1)
    trainer.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=100.0)
    report = trainer.autoscale()
    assert (report["produced"], report["consumed"]) == (16, 10)
    assert "< 0.05" in report["pools"]["cpu"]["reason"]
    assert report["pools"]["cpu"]["target"] == math.ceil(2 * 10 / 16 * 1.1)


def test_the_window_forgets_what_is_older_than_it_without_being_asked():
    # an hour of submissions at 200/s from two pools and a step a second, nobody
    # reading the report: the window holds a minute of them, not the run
    from astraflow.dataflow.autoscale import AutoscaleWindow

    now = [0.0]
    window = AutoscaleWindow(60.0, clock=lambda: now[0])
    for tick in range(3600 * 200):
        now[0] = tick / 200
        window.produce("a" if tick % 2 else "b", 4)
        if tick % 200 == 0:
            window.step(0.5, 1.0, 64)
    assert len(window.produced) <= 2 * 61 and len(window.steps) <= 61
    report = window.report({"a": 10, "b": 10})
    # the last minute's production, whichever way it was counted
    produced = sum(p["produced"] for p in report["pools"].values())
    assert 0.98 * 60 * 200 * 4 <= produced <= 200 * 4 * 61
