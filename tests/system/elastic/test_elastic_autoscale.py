"""autoscale=true: the launcher grows its pool of local nodes when the trainer starves,
within max_nodes, following the data layer's dead-band report."""

from __future__ import annotations

import json

from launched_runs import pids_of, reaped, records, start_run


def test_launcher_grows_a_starving_pool_within_its_bounds(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "autoscale"
    # one slow node (one task in flight, 0.5 s a rollout) cannot keep the trainer busy
    launcher = start_run(run_dir, tiny_model_dir, "steps=10", "eval_every=10",
                         "batch_size=16", "num_nodes=1", "node_concurrency=1",
                         "raas.generation_seconds=0.5", "autoscale=true", "min_nodes=1",
                         "max_nodes=3", "launcher.autoscale_interval=0.5",
                         "launcher.autoscale_cooldown=2")
    with reaped(launcher):
        _out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    events = [r for r in records(run_dir / "metrics" / "launcher.jsonl")
              if r["event"] == "autoscale"]
    assert events, err[-3000:]
    assert events[0]["nodes"] == 1 and events[0]["target"] > 1
    assert "wait fraction" in events[0]["reason"]
    assert all(e["target"] <= 3 for e in events)
    started = {p.name.removesuffix(".log") for p in (run_dir / "logs").glob("raas-*.log")}
    assert len(started) == max(e["target"] for e in events)
    for log in (run_dir / "logs").glob("raas-*.log"):
        assert "registered as" in log.read_text()
    assert json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]["steps"] \
        == 10
    assert not pids_of(f"--work-dir {run_dir} ")


def test_autoscale_bounds_are_checked_before_anything_starts(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "astraflow", "autoscale=true", "num_nodes=5",
                           "max_nodes=3", f"run_dir={tmp_path / 'r'}", "model.path=/nonexistent"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "min_nodes <= num_nodes <= max_nodes" in proc.stderr
