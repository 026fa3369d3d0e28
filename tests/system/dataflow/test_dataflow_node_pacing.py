"""A node the data layer refused for staleness asks again the moment it loads newer
weights: a real RaaS node (the tiny model on the HF engine) against the data layer."""

from __future__ import annotations


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
