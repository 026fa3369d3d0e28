"""A node stopped after its data layer died (a launcher killed: every component gets
SIGTERM at once) still ends: telling the data layer it leaves is best-effort, not the
client's minutes of retries."""

from __future__ import annotations

import asyncio

from astraflow.config import compose_config
from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.raas.node import NodeOptions, RaaSNode
from astraflow.testing import wait_until
from astraflow.testing.engine import LoopThread
from astraflow.weights.client import HttpPublishTarget
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.safetensors_io import load

TOKEN = "node-leave-token"


def test_a_node_stopped_after_its_data_layer_died_ends(tmp_path, tiny_model_dir):
    server = BackgroundServer(DataflowSettings(store=str(tmp_path / "store"),
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
    finally:
        server.stop()
    loop.loop.call_soon_threadsafe(stop.set)
    try:
        running.result(timeout=60)  # the client alone would retry its leave for 300 s
    finally:
        loop.close()
