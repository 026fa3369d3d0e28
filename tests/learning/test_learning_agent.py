"""An agent written for the OpenAI API learns through the endpoint, unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from launched_runs import records

from astraflow.testing import launch_run, run_summary

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agent"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the run's own limit below, not the suite's 600 s
def test_an_agent_driving_its_own_calls_learns(tmp_path):
    """The agent makes the calls; AstraFlow only serves them and trains what was sampled.
    Held-out accuracy is measured through the same agent (the evaluator runs the
    workflow)."""
    (tmp_path / "agent.py").write_text((EXAMPLES / "answer_agent.py").read_text())
    run_dir = tmp_path / "run"
    # 150 steps of the default 600, at the default rate (3e-4: 5e-4 first lost accuracy
    # for some 30 steps and gained half as much; 1e-3 collapsed); held-out accuracy at the
    # start and the end only: each evaluation runs the agent on every held-out task
    # (sampled and greedy), on the CPUs training needs
    launch_run(tmp_path, "workflow=agent", "agent.path=agent.py", "steps=150",
               "batch_size=256", "eval_every=0", f"run_dir={run_dir}", timeout=1200)
    result = run_summary(run_dir)["policy"]
    gain = result["final_eval_accuracy"] - result["start_eval_accuracy"]
    # the last step of each number (a restarted trainer logs its journal's steps again)
    steps = {r["step"]: r for r in records(run_dir / "metrics" / "train-policy.jsonl")}
    rewards = [steps[k]["reward_mean"] for k in sorted(steps)]
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    print(f"held-out accuracy {result['start_eval_accuracy']:.3f} -> "
          f"{result['final_eval_accuracy']:.3f} ({gain:+.3f}); training reward "
          f"{first:.3f} -> {last:.3f} (first and last 15 steps)")
    # 100 steps gained +0.05 to +0.12 held-out (the lowest under the suite's load, 2 Intel
    # Xeon cores): too close to the bar. 150 steps (Intel Xeon, 2 cores): 0.173 -> 0.356
    # (+0.18) alone in 65 s; seeds 1 and 2 side by side +0.11 and +0.18. The training
    # reward is the mean of 15 steps over 3,840 samples (standard error ~0.01). The
    # held-out gain is the noisier (800 samples a reading): its bar is three standard
    # errors, the training reward's rise the firmer one
    assert last - first >= 0.10
    assert gain >= 0.06
    assert all(r["reward_failed"] == 0 for r in steps.values())
