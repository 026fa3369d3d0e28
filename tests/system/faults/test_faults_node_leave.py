"""A node stopped after its data layer died (a launcher killed: every component gets
SIGTERM at once) still ends: telling the data layer it leaves is best-effort, not the
client's minutes of retries."""

from __future__ import annotations

from node_in_process import start_node

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
