"""A RaaS node run in the test's process against a real data layer on 127.0.0.1: for the
node's own behaviour (how it stops, what it says) without a launcher around it."""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass
class NodeInProcess:
    server: BackgroundServer
    node: RaaSNode
    loop: LoopThread
    stop: asyncio.Event
    #: the node's ``run``: its result, or the error it stopped with
    running: concurrent.futures.Future[Any]
    token: str

    def close(self) -> None:
        """Stop the node if it still runs, then its loop and the data layer."""
        if not self.running.done():
            self.loop.loop.call_soon_threadsafe(self.stop.set)
            self.running.exception(timeout=60)
        self.loop.close()
        self.server.stop()

    def wait_for_rollouts(self, timeout: float = 120) -> None:
        with DataflowClient(self.server.url, self.token) as client:
            wait_until(lambda: client.status()["tasks"]["completed"] > 0, timeout,
                       "the node's first rollouts")


def start_node(tmp_path: Path, model_dir: str, token: str, leave_grace: float = 1.0,
               **settings: Any) -> NodeInProcess:
    """A data layer serving arithmetic tasks (``settings`` on top), the model's weights
    published as version 0, and a node of four rollouts at a time leasing from it."""
    server = BackgroundServer(DataflowSettings(store=str(tmp_path / "store"),
                                               task={"name": "arithmetic"}, **settings),
                              token).start()
    tensors, _ = load(f"{model_dir}/model.safetensors")
    WeightPublisher(HttpPublishTarget(server.url, token), "policy").publish(0, tensors)
    node = RaaSNode(compose_config([f"model.path={model_dir}"]), server.url, token,
                    str(tmp_path / "node"), NodeOptions(concurrency=4, leave_grace=leave_grace),
                    node_name="n")
    loop = LoopThread()
    stop = asyncio.Event()
    running = asyncio.run_coroutine_threadsafe(node.run(stop), loop.loop)
    return NodeInProcess(server, node, loop, stop, running, token)
