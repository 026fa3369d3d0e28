"""A published version the node's engine cannot load -- tensor names or shapes that do
not fit its model, as a trainer exporting names the engine does not know publishes --
stops the node with the engine's reason after it failed the same way a few times,
instead of retrying in silence while the run hangs. It keeps serving the version it
had until then."""

from __future__ import annotations

import logging

import pytest
from node_in_process import start_node

from astraflow.raas.node import LOAD_FAILURES, WeightsLoadError
from astraflow.weights.client import HttpPublishTarget
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.safetensors_io import load

TOKEN = "weights-unloadable-token"


def test_a_node_that_cannot_load_a_version_stops_saying_why(tmp_path, tiny_model_dir,
                                                            caplog):
    started = start_node(tmp_path, tiny_model_dir, TOKEN)
    node, running = started.node, started.running
    try:
        started.wait_for_rollouts()
        tensors, _ = load(f"{tiny_model_dir}/model.safetensors")
        renamed = sorted(tensors)[0]
        tensors[f"{renamed}.experts.0"] = tensors.pop(renamed)  # a name the model lacks
        with caplog.at_level(logging.ERROR, logger="astraflow.raas.node"):
            WeightPublisher(HttpPublishTarget(started.server.url, TOKEN), "policy").publish(
                1, tensors)
            with pytest.raises(WeightsLoadError) as stopped:
                running.result(timeout=120)
    finally:
        started.close()
    said = str(stopped.value)
    assert said.startswith("node n: policy version 1 does not load: "), said
    assert renamed in said  # the engine's reason names what is missing
    attempts = [r.getMessage() for r in caplog.records if "does not load" in r.getMessage()]
    assert len(attempts) == LOAD_FAILURES
    assert attempts[-1].endswith(f"(attempt {LOAD_FAILURES} of {LOAD_FAILURES})")
    assert node.backends["policy"].version == 0  # it served what it had meanwhile
