"""A reward's outcome is a typed part of the trajectory from the node to the trainer:
failed, why, and the reward's extra metrics -- counted by the data layer, kept out of
the group's statistics, and served to the trainer as they were submitted."""

from __future__ import annotations

import httpx
import pytest
from dataflow_helpers import TOKEN, group

from astraflow.rl.advantages import group_advantages
from astraflow.types import RewardOutcome


def _submit(c, outcomes):
    (lease,) = c.lease_tasks()
    trajs = group(lease.task.task_id, [1.0, 0.0, 1.0, 0.0])
    for traj, outcome in zip(trajs, outcomes, strict=True):
        traj.outcome = outcome
    return c.submit(lease, trajs)


def test_a_failed_reward_travels_typed_and_is_counted(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=4)
    c = connect(server)
    c.register("raas")
    boom = RewardOutcome(failed=True, reason="Traceback ...\nZeroDivisionError: x")
    scored = RewardOutcome(metrics={"len": 3.0})
    assert _submit(c, [scored, boom, RewardOutcome(), boom])["accepted"] == 4
    st = c.status()["policies"]["policy"]
    assert (st["reward_failed"], st["produced"]) == (2, 4)
    assert st["first_reward_error"].endswith("ZeroDivisionError: x")

    batch = c.get_batch("policy", 4, timeout=5)
    # the failed samples get 0 and are left out of the group's mean and std
    assert sorted(i.advantage for i in batch.items) == pytest.approx(
        sorted([*group_advantages([1.0, 1.0]), 0.0, 0.0]))
    served = sorted((i.trajectory.outcome for i in batch.items), key=repr)
    assert served == sorted([scored, boom, RewardOutcome(), boom], key=repr)
    # the typed outcome is the only record of it: nothing is put in the metadata
    assert all("reward_failed" not in i.trajectory.metadata for i in batch.items)


def test_an_outcome_over_json_is_checked_and_a_bad_one_named(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=1)
    c = connect(server)
    c.register("raas")
    (lease,) = c.lease_tasks()
    (traj,) = group(lease.task.task_id, [1.0])
    body = {"lease_id": lease.lease_id, "trajectories": [{
        "task_id": traj.task_id, "group_id": traj.group_id, "policy": traj.policy,
        "tokens": traj.tokens, "logprobs": traj.logprobs, "loss_mask": traj.loss_mask,
        "versions": traj.versions, "spans": [vars(s) for s in traj.spans],
        "reward": 1.0, "outcome": {"metrics": {"len": "long"}}}]}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    bad = httpx.post(f"{server.url}/v1/trajectories", json=body, headers=headers)
    assert bad.status_code == 422
    assert "trajectories.0.outcome.metrics.len" in bad.json()["detail"]
    body["trajectories"][0]["outcome"] = {"failed": True, "reason": "timed out"}
    ok = httpx.post(f"{server.url}/v1/trajectories", json=body, headers=headers)
    assert ok.status_code == 200 and ok.json()["accepted"] == 1
    assert c.status()["policies"]["policy"]["first_reward_error"] == "timed out"
