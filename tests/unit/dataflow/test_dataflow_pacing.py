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


def test_a_node_refused_for_staleness_asks_again_as_soon_as_it_loads_newer_weights(
        start_server, connect, tiny_model_dir, tmp_path, monkeypatch):
    """Refused because what it would generate would be too stale, a node with nothing in
    flight can only be issued more once it holds newer weights; it asks the moment they
    load instead of after a pause (the pause was a trainer waiting for data)."""
    import asyncio

    from dataflow_helpers import TOKEN, wait_until

    import astraflow.raas.node as node_module
    from astraflow.config import compose_config
    from astraflow.raas.node import NodeOptions, RaaSNode
    from astraflow.testing.engine import LoopThread
    from astraflow.weights.client import HttpPublishTarget
    from astraflow.weights.publisher import WeightPublisher
    from astraflow.weights.safetensors_io import load

    # no timer asks for it: only the loaded version can start the second rollout
    monkeypatch.setattr(node_module, "IDLE_POLL", 600.0)
    monkeypatch.setattr(node_module, "BUSY_POLL", 600.0)
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 0}, group_size=8,
                          batch_size=8)
    trainer = connect(server)
    trainer.register("trainer", policies=["policy"], node_id="trainer-policy")
    publisher = WeightPublisher(HttpPublishTarget(server.url, TOKEN), "policy")
    tensors, _ = load(f"{tiny_model_dir}/model.safetensors")
    publisher.publish(0, tensors)
    cfg = compose_config([f"model.path={tiny_model_dir}", "policies.policy.max_staleness=0",
                          "batch_size=8", "group_size=8"])
    node = RaaSNode(cfg, server.url, TOKEN, str(tmp_path / "node"),
                    NodeOptions(concurrency=4), node_name="n")
    loop = LoopThread()
    stop = asyncio.Event()
    running = asyncio.run_coroutine_threadsafe(node.run(stop), loop.loop)
    try:
        # max_staleness=0: one batch from version 0, then nothing until version 1 loads
        first = trainer.get_batch("policy", 8, timeout=120, trainer_id="trainer-policy")
        assert first is not None
        assert {i.trajectory.min_version for i in first.items} == {0}
        refusals = lambda: trainer.status()["policies"]["policy"]["admission_refusals"]  # noqa: E731
        wait_until(lambda: sum(refusals().values()) > 0, 60, "a lease refused to the node")
        publisher.publish(1, tensors)
        trainer.ack_batch(first.batch_id, wait_seconds=0.0, step_seconds=0.1)
        second = trainer.get_batch("policy", 8, timeout=60, trainer_id="trainer-policy")
        assert second is not None, "the node did not ask again when version 1 loaded"
        assert {i.trajectory.min_version for i in second.items} == {1}
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=60)
        loop.close()
