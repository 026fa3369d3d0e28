"""solve_select and solve_testgen train both their policies on the tiny model, each on
its own tokens only, with code graded in the sandbox (reward=code)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from astraflow.types import Batch

CASES = {
    # workflow: (the second policy, the foreign spans its own trajectories must show)
    "solve_select": ("selector", {"selector": "solver"}),
    # the untrained tester mostly ends its answer at once, and an empty answer puts no
    # tests above the problem: the solver's view of the tests is checked on written
    # tests in tests/system/workflows/test_workflows_code.py, the masks of any shown here
    "solve_testgen": ("tester", {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("workflow", list(CASES))
def test_a_code_workflow_trains_each_policy_on_its_own_tokens(tmp_path, tiny_model_dir,
                                                              workflow):
    other, context = CASES[workflow]
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", f"workflow={workflow}", "task=functions",
         "reward=code", "+experiment=smoke", "record_batches=true", "workflow.candidates=2",
         "node_concurrency=2", "task.num_eval=4", "eval_samples=2",
         f"model.path={tiny_model_dir}", f"run_dir={run_dir}", "launcher.progress=false"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]
    assert set(summary) == {"solver", other}
    for policy in ("solver", other):
        assert summary[policy]["steps"] == 3
        lines = (run_dir / "metrics" / f"batches-{policy}.jsonl").read_text().splitlines()
        batches = [Batch.from_dict({k: v for k, v in json.loads(line).items() if k != "step"})
                   for line in lines]
        assert len(batches) == 3
        foreign = 0
        for item in (item for batch in batches for item in batch.items):
            traj = item.trajectory
            traj.validate()
            assert traj.policy == policy
            for span in traj.spans:
                mask = traj.loss_mask[span.start:span.end]
                # only the policy's own turns train; prompts and the other's turns are
                # context
                assert set(mask) == {int(span.source == policy)}, (policy, span)
                foreign += span.source == context.get(policy)
            assert sum(traj.loss_mask) > 0
        if policy in context:  # candidates for the selector, tests for the solver
            assert foreign > 0
    rewards = {p: [json.loads(line)["reward_mean"] for line in
                   (run_dir / "metrics" / f"train-{p}.jsonl").read_text().splitlines()]
               for p in ("solver", other)}
    # rewards from the sandboxed tests: shares of tests passed, a selector's lift over
    # a random pick, a tester's 0 or 0.5..1
    assert all(0.0 <= r <= 1.0 for r in rewards["solver"])
    assert all(-1.0 <= r <= 1.0 for r in rewards[other])
