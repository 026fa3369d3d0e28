"""A node whose engine died under it (every generate raising, as vLLM's does once its
engine core is gone) stops with the engine's error, so that its launcher starts it
again, instead of failing every rollout it leases for as long as the run lasts."""

from __future__ import annotations

import asyncio

import pytest

from astraflow.config import compose_config
from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.raas import node as node_module
from astraflow.raas.node import NodeOptions, RaaSNode
from astraflow.testing import wait_until
from astraflow.testing.engine import LoopThread
from astraflow.weights.client import HttpPublishTarget
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.safetensors_io import load

TOKEN = "engine-dead-token"


class EngineDeadError(RuntimeError):
    """What a dead engine raises for every request."""


def test_a_node_whose_engine_died_stops_with_its_error(tmp_path, tiny_model_dir,
                                                       monkeypatch):
    monkeypatch.setattr(node_module, "FAILED_IN_A_ROW", 8)
    monkeypatch.setattr(node_module, "FAILING_SECONDS", 2.0)
    # a failed rollout's task goes back when its lease expires: short leases, so that the
    # node leases (and fails) again within seconds
    server = BackgroundServer(DataflowSettings(store=str(tmp_path / "store"), lease_seconds=3,
                                               task={"name": "arithmetic"}), TOKEN).start()
    tensors, _ = load(f"{tiny_model_dir}/model.safetensors")
    WeightPublisher(HttpPublishTarget(server.url, TOKEN), "policy").publish(0, tensors)
    node = RaaSNode(compose_config([f"model.path={tiny_model_dir}"]), server.url, TOKEN,
                    str(tmp_path / "node"), NodeOptions(concurrency=4, leave_grace=1.0),
                    node_name="n")
    loop = LoopThread()
    stop = asyncio.Event()
    running = asyncio.run_coroutine_threadsafe(node.run(stop), loop.loop)
    try:
        with DataflowClient(server.url, TOKEN) as client:
            wait_until(lambda: client.status()["tasks"]["completed"] > 0, 120,
                       "the node's first rollouts")

        async def dead(request):
            raise EngineDeadError("EngineCore encountered an issue")

        (engine,) = node.engines
        engine.generate = dead  # the engine dies under the running node
        with pytest.raises(RuntimeError) as stopped:
            running.result(timeout=120)
    finally:
        if not running.done():
            loop.loop.call_soon_threadsafe(stop.set)
            running.exception(timeout=60)
        loop.close()
        server.stop()
    said = str(stopped.value)
    assert said.startswith("node n: its last ") and "rollouts failed" in said, said
    assert "EngineDeadError('EngineCore encountered an issue')" in said
    assert node.failed_in_a_row >= 8
