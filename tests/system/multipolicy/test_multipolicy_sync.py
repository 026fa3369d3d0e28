"""mode=sync with policies that get unequal samples per task still completes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_sync_baseline_fills_a_verifier_that_trains_on_fewer_samples(tmp_path,
                                                                          tiny_model_dir):
    """solve_verify gives the solver every first answer and each retry, the verifier only
    the groups that judged both right and wrong answers: an iteration's tasks fill the
    solver's batch before the verifier's. The sync barrier keeps leasing for the
    verifier (the solver's extra samples are dropped as stale) instead of stopping.

    Long-tail turn latency makes each leasing round outlast a training step, as on a
    real cluster: the solver's trainer has stepped before the round that would fill the
    verifier leases."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "workflow=solve_verify", "mode=sync",
         "+experiment=smoke", "batch_size=16", "workflow.latency.kind=lognormal",
         "workflow.latency.median=0.3", "workflow.latency.sigma=1.2", "workflow.latency.max=5",
         f"model.path={tiny_model_dir}", f"run_dir={run_dir}", "launcher.progress=false"],
        capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]
    assert {p: s["steps"] for p, s in summary.items()} == {"solver": 3, "verifier": 3}
    produced = {p: s["trajectories_generated"] for p, s in summary.items()}
    assert produced["solver"] > produced["verifier"]
