"""Heterogeneous pools on one CPU: nodes capped at 100%, 60% and 30% of their throughput
(launcher.node_throttle) each deliver their share, and the slow ones hold nobody up."""

from __future__ import annotations

import re

from launched_runs import reaped, start_run, train_records


def test_throttled_nodes_deliver_their_fraction(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "heterogeneous"
    launcher = start_run(run_dir, tiny_model_dir, "steps=16", "eval_every=16",
                         "batch_size=16", "num_nodes=3", "node_concurrency=2",
                         "raas.generation_seconds=0.5", "launcher.node_throttle=[1.0,0.6,0.3]",
                         "policies.policy.max_staleness=8")
    with reaped(launcher):
        _out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    rollouts = []
    for i in range(3):
        log = (run_dir / "logs" / f"raas-{i}.log").read_text()
        rollouts.append(int(re.search(r"left after (\d+) rollouts", log).group(1)))
    fast, mid, slow = rollouts
    assert fast > mid > slow > 0, rollouts
    assert 0.4 <= mid / fast <= 0.8 and 0.15 <= slow / fast <= 0.45, rollouts
    assert len(train_records(run_dir)) == 16
