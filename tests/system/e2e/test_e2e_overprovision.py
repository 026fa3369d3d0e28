"""Over-provisioned groups in a real run: a node starts extra samples per group, trains
the first back, and the run reports what it cancelled apart from what it generated."""

import json
import subprocess
import sys


def test_a_run_trains_the_first_samples_back_and_reports_the_cancelled_apart(
        tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", "steps=4",
         "workflow.latency.kind=lognormal", "workflow.latency.median=0.02",
         "workflow.group.extra=3", "workflow.group.audit=1.0",
         f"model.path={tiny_model_dir}", f"run_dir={run_dir}", "launcher.progress=false"],
        capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    generated = summary["trajectories_generated"]
    # groups of 4 (the smoke config) arrive whole: the 3 extra of each never do
    assert generated > 0 and generated % 4 == 0
    assert summary["samples_cancelled"] == 3 * generated // 4
    assert summary["trained_fraction"] >= 0.98
    steps = [json.loads(line) for line in
             (run_dir / "metrics" / "train-policy.jsonl").read_text().splitlines()]
    assert len(steps) == 4
    for step in steps:
        # batches of 8 are two groups, each audited: its 3 cancelled samples' rewards
        assert step["overprovision/cancelled"] == 6
        assert step["overprovision/audited_groups"] == 2
        assert 0.0 <= step["overprovision/kept_reward"] <= 1.0
        assert 0.0 <= step["overprovision/cancelled_reward"] <= 1.0
        assert 0.0 < step["train/ess_fraction"] <= 1.0
        assert step["train/offpolicy_kl"] >= 0.0
    assert steps[-1]["cancelled_total"] >= 6 * 4
    node_log = (run_dir / "logs" / "raas-0.log").read_text()
    assert "workflow.group.extra=3 (set)" in node_log
