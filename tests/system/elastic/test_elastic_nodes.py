"""Nodes join and leave a running job: start with one, add two from outside the launcher,
remove one; every node's trajectories are trained on and none is too stale."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import msgpack
from launched_runs import ledger, start_run, train_records, wait_for

STEPS = 24
MAX_STALENESS = 4
TOKEN = "elastic-test-token"


def join(run_dir: Path, name: str, *extra: str) -> subprocess.Popen:
    """`astraflow raas --connect URL` from another shell, as an operator would."""
    url = (run_dir / "store" / "url").read_text().strip()
    work = run_dir.parent / name
    return subprocess.Popen(
        [sys.executable, "-m", "astraflow", "raas", "--connect", url, "--config",
         str(run_dir / "config.yaml"), "--work-dir", str(work), "--name", name,
         "--pool", name, "--region", "elsewhere", "--concurrency", "2", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, ASTRAFLOW_TOKEN=TOKEN, OMP_NUM_THREADS="1"),
    )


def status(run_dir: Path) -> dict:
    url = (run_dir / "store" / "url").read_text().strip()
    return httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"},
                     timeout=5).json()


def leave(node: subprocess.Popen) -> tuple[int, str]:
    node.send_signal(signal.SIGTERM)
    out, _ = node.communicate(timeout=60)
    return node.returncode, out


def rollouts(log: str) -> int:
    return int(re.search(r"left after (\d+) rollouts", log).group(1))


def held_by_node(run_dir: Path) -> dict[str, int]:
    """Trajectories accepted but not yet trained when the run ended, per node."""
    import sqlite3

    from astraflow.dataflow.payloads import PayloadLog

    log = PayloadLog(run_dir / "store" / "payloads")
    with sqlite3.connect(run_dir / "store" / "dataflow.sqlite3") as conn:
        held: dict[str, int] = {}
        for loc in conn.execute("SELECT seg, off, len, crc FROM items"):
            node = msgpack.unpackb(log.read(loc))["metadata"]["node_id"]
            held[node] = held.get(node, 0) + 1
    log.close()
    return held


def test_nodes_join_and_leave_a_running_job(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("ASTRAFLOW_TOKEN", TOKEN)
    run_dir = tmp_path / "elastic"
    # three nodes produce less than the trainer consumes, so no trajectory waits long
    # enough to turn stale: every one accepted must be trained on
    launcher = start_run(run_dir, tiny_model_dir, f"steps={STEPS}", f"eval_every={STEPS}",
                         "num_nodes=1", "node_concurrency=2", "batch_size=16",
                         "raas.generation_seconds=0.8",
                         f"policies.policy.max_staleness={MAX_STALENESS}")
    step = lambda: (train_records(run_dir) or [{"step": 0}])[-1]["step"]  # noqa: E731
    joined: dict[str, subprocess.Popen] = {}
    logs: dict[str, str] = {}
    try:
        wait_for(lambda: step() >= 2, 240, "trainer step 2", launcher)
        version_at_join = status(run_dir)["versions"]["policy"]
        joined = {name: join(run_dir, name) for name in ("ext-a", "ext-b")}
        wait_for(lambda: {"raas-ext-a", "raas-ext-b"} <= {
            n["node_id"] for n in status(run_dir)["nodes"] if n["state"] == "active"},
            120, "both joining nodes registered", launcher)
        wait_for(lambda: step() >= STEPS // 2, 240, "half the steps", launcher)
        code, logs["ext-b"] = leave(joined.pop("ext-b"))
        assert code == 0, logs["ext-b"][-2000:]
        wait_for(lambda: step() >= STEPS - 4, 240, "nearly all steps", launcher)
        code, logs["ext-a"] = leave(joined.pop("ext-a"))
        assert code == 0, logs["ext-a"][-2000:]
        _out, err = launcher.communicate(timeout=240)
    finally:
        for node in joined.values():
            node.kill()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, err[-3000:]

    # a joining node caught up to the newest weights before it registered
    for log in logs.values():
        first = int(re.search(r"now at version (\d+)", log).group(1))
        assert first >= version_at_join
        assert log.index("now at version") < log.index("registered as")
    # nothing was dropped, so every accepted trajectory was trained on or is still
    # buffered for the next step; every node contributed trained-on trajectories
    c = ledger(run_dir)
    assert c.get("dropped_stale:policy", 0) == 0 and c.get("filtered:policy", 0) == 0
    assert c["produced:policy"] == c["consumed:policy"] + c["items_held"]
    held = held_by_node(run_dir)
    for name in ("ext-a", "ext-b"):
        assert rollouts(logs[name]) * 4 > held.get(f"raas-{name}", 0), (name, held)
    assert held.get("raas-ext-b", 0) == 0  # left mid-run: all of its work was trained on
    local = c["produced:policy"] - 4 * (rollouts(logs["ext-a"]) + rollouts(logs["ext-b"]))
    assert local > held.get("raas-node-0", 0)
    # none was produced from weights older than the staleness bound
    assert max(r["staleness_max"] for r in train_records(run_dir)) <= MAX_STALENESS
