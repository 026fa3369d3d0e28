"""A node whose engine died under it (every generate raising, as vLLM's does once its
engine core is gone) stops with the engine's error, so that its launcher starts it
again, instead of failing every rollout it leases for as long as the run lasts."""

from __future__ import annotations

import pytest
from node_in_process import start_node

from astraflow.raas import node as node_module

TOKEN = "engine-dead-token"


class EngineDeadError(RuntimeError):
    """What a dead engine raises for every request."""


def test_a_node_whose_engine_died_stops_with_its_error(tmp_path, tiny_model_dir,
                                                       monkeypatch):
    monkeypatch.setattr(node_module, "FAILED_IN_A_ROW", 8)
    monkeypatch.setattr(node_module, "FAILING_SECONDS", 2.0)
    # a failed rollout's task goes back when its lease expires: short leases, so that the
    # node leases (and fails) again within seconds
    started = start_node(tmp_path, tiny_model_dir, TOKEN, lease_seconds=3)
    node, running = started.node, started.running
    try:
        started.wait_for_rollouts()

        async def dead(request):
            raise EngineDeadError("EngineCore encountered an issue")

        (engine,) = node.engines
        engine.generate = dead  # the engine dies under the running node
        with pytest.raises(RuntimeError) as stopped:
            running.result(timeout=120)
    finally:
        started.close()
    said = str(stopped.value)
    assert said.startswith("node n: its last ") and "rollouts failed" in said, said
    assert "EngineDeadError('EngineCore encountered an issue')" in said
    assert node.failed_in_a_row >= 8
