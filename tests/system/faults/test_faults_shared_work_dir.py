"""Nodes started with the same --work-dir (as the launcher starts them) keep separate
weight copies: one node must not resume another's partial download or prune the
version another node's engine is loading (seen as a node crash under SIGKILL faults)."""

from pathlib import Path

from astraflow.config import compose_config
from astraflow.raas.node import RaaSNode


def test_nodes_sharing_a_work_dir_sync_weights_into_their_own_directories(tmp_path):
    cfg = compose_config([f"model.path={tmp_path / 'model'}"])  # never loaded here
    dirs = []
    for name in ("node-0", "node-1", "node-0"):
        node = RaaSNode(cfg, "http://127.0.0.1:9", "token", str(tmp_path), node_name=name)
        dirs.append(Path(node.weights.local_dir))
        node.weights.close()
    assert dirs[0] != dirs[1], "two nodes would race on one download directory"
    assert dirs[0] == dirs[2], "a restarted node must find its own partial downloads"
    assert all(d.parent == tmp_path / "weights" and d.is_dir() for d in dirs)
