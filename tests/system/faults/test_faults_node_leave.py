"""A node stopped after its data layer died (a launcher killed: every component gets
SIGTERM at once) still ends: telling the data layer it leaves is best-effort, not the
client's minutes of retries."""

from __future__ import annotations

import logging
import time

from node_in_process import start_node

from astraflow.testing import wait_until

TOKEN = "node-leave-token"


def test_a_node_stopped_after_its_data_layer_died_ends(tmp_path, tiny_model_dir):
    started = start_node(tmp_path, tiny_model_dir, TOKEN)
    try:
        started.wait_for_rollouts()
    finally:
        started.server.stop()
    started.loop.loop.call_soon_threadsafe(started.stop.set)
    try:
        started.running.result(timeout=60)  # the client alone would retry its leave for 300 s
    finally:
        started.loop.close()


def test_a_node_whose_data_layer_is_gone_does_not_wait_out_its_grace(tmp_path, tiny_model_dir,
                                                                      caplog):
    """A leaving node gives its rollouts in flight ``leave_grace`` to finish, for a data
    layer that will take them. Once nothing listens at the data layer's address, nothing
    can: the node drops them at once (their tasks are in the data layer's store, to be
    issued again) and ends, instead of keeping the user waiting 20 s after a killed
    launcher."""
    grace = 30.0
    started = start_node(tmp_path, tiny_model_dir, TOKEN, leave_grace=grace)
    try:
        started.wait_for_rollouts()
    finally:
        started.server.stop()
    # the rollouts leased before it went: their submissions retry a data layer that is gone
    wait_until(lambda: started.node.in_flight > 0, 30, "a rollout in flight")
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="astraflow.raas"):
        started.loop.loop.call_soon_threadsafe(started.stop.set)
        try:
            started.running.result(timeout=grace * 2)
        finally:
            started.loop.close()
    assert time.monotonic() - began < grace / 2, caplog.text
    assert "the data layer is gone; dropped" in caplog.text
    assert "leave failed" not in caplog.text
