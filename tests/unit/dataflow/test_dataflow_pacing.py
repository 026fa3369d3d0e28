"""Pacing: the data layer tells each node the rate that keeps the trainers fed, and a
node keeps rate x turnaround tasks in flight (Little's law), bounded by its concurrency."""

from __future__ import annotations

import pytest
from dataflow_helpers import group

from astraflow.raas.node import START_IN_FLIGHT, in_flight_target


def test_lease_replies_carry_each_nodes_share_of_what_the_trainer_consumes(start_server,
                                                                           connect):
    # batch 4 of 2-sample tasks: a trainer step of 0.2 s of compute (0.1 s of its 0.3 s
    # was waiting) consumes 20 samples/s, 10 tasks/s, 5 for each of two nodes
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=2,
                          batch_size=4)
    trainer, a, b = connect(server), connect(server), connect(server)
    a.register("raas")
    b.register("raas")
    leases = a.lease_tasks(max_tasks=2)
    assert a.pace["tasks_per_second"] is None  # no step yet: nothing measured
    for lease in leases:
        a.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    trainer.ack_batch(trainer.get_batch("policy", 4, timeout=1).batch_id,
                      wait_seconds=0.1, step_seconds=0.3)
    b.lease_tasks(max_tasks=3)
    assert b.pace["tasks_per_second"] == pytest.approx(5.0)
    nodes = {n["node_id"]: n for n in trainer.status()["nodes"]}
    assert nodes[b.node_id]["in_flight"] == 3 and nodes[a.node_id]["in_flight"] == 0
    # a's leases came back: its turnaround is measured, b's not yet
    assert nodes[a.node_id]["turnaround_seconds"] > 0
    assert nodes[b.node_id]["turnaround_seconds"] is None


def test_a_node_keeps_rate_times_turnaround_in_flight_within_its_bound():
    # 5 tasks/s taking 2 s each: 10 in flight keep up; half again for jitter, plus one
    assert in_flight_target(5.0, 2.0, cap=64) == 16
    # ten times the latency, ten times the tasks in flight, up to the bound
    assert in_flight_target(5.0, 20.0, cap=256) == 151
    assert in_flight_target(5.0, 20.0, cap=64) == 64
    assert in_flight_target(5.0, 0.01, cap=64) == 2
    # nothing measured yet: a start that does not flood a slow workload
    assert in_flight_target(None, 2.0, cap=64) == START_IN_FLIGHT < 64
    assert in_flight_target(5.0, None, cap=64) == START_IN_FLIGHT
    assert in_flight_target(None, None, cap=4) == 4
