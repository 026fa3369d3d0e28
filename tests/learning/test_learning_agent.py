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
    # 250 steps rather than the default 600, so a larger rate than the default 3e-4;
    # held-out accuracy at the start and the end only: each evaluation runs the agent on
    # every held-out task (sampled and greedy), on the CPUs training needs
    launch_run(tmp_path, "workflow=agent", "agent.path=agent.py", "steps=250",
               "batch_size=256", "eval_every=250", "trainer.lr=5e-4", f"run_dir={run_dir}",
               timeout=1200)
    result = run_summary(run_dir)["policy"]
    gain = result["final_eval_accuracy"] - result["start_eval_accuracy"]
    print(f"held-out accuracy {result['start_eval_accuracy']:.3f} -> "
          f"{result['final_eval_accuracy']:.3f} ({gain:+.3f})")
    # measured on 2 AMD EPYC cores: 0.17 -> 0.35 (+18) at step 200, 0.36 (+19) at 250,
    # 0.41 (+24) at 350 (573 s); accuracy barely moves in the first 150 steps
    assert gain >= 0.12
    assert all(r["reward_failed"] == 0 for r in records(run_dir / "metrics" / "train-policy.jsonl"))
