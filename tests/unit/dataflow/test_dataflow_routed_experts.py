"""Router replay's routed experts travel with a trajectory from the node to the trainer:
stored and served byte for byte, over msgpack and JSON, and a payload that does not fit
its tokens refused with what is wrong."""

from __future__ import annotations

import httpx
import numpy as np
from dataflow_helpers import TOKEN, group

from astraflow.routing import extend, from_array, to_array


def routed_for(traj, layers=2, top_k=2, seed=0):
    rng = np.random.default_rng(seed)
    experts = rng.integers(0, 8, size=(len(traj.tokens), layers, top_k))
    experts[-1] = -1  # the last token was never run
    return from_array(experts, num_experts=8)


def test_routed_experts_are_served_to_the_trainer_as_the_node_sent_them(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=2)
    c = connect(server)
    c.register("raas")
    (lease,) = c.lease_tasks()
    trajs = group(lease.task.task_id, [1.0, 0.0])
    trajs[0].routed_experts = routed_for(trajs[0])  # one carries them, one does not
    assert c.submit(lease, trajs)["accepted"] == 2
    batch = c.get_batch("policy", 2, timeout=5)
    served = {i.trajectory.reward: i.trajectory.routed_experts for i in batch.items}
    assert served[0.0] is None
    assert served[1.0] == trajs[0].routed_experts
    assert (to_array(served[1.0])[-1] == 255).all()  # not routed, kept as such


def test_routed_experts_over_json_are_checked_against_the_tokens(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=1)
    c = connect(server)
    c.register("raas")
    (lease,) = c.lease_tasks()
    (traj,) = group(lease.task.task_id, [1.0])
    routed = routed_for(traj)
    entries = to_array(routed).reshape(-1).tolist()
    body = {"lease_id": lease.lease_id, "trajectories": [{
        "task_id": traj.task_id, "group_id": traj.group_id, "policy": traj.policy,
        "tokens": traj.tokens, "logprobs": traj.logprobs, "loss_mask": traj.loss_mask,
        "versions": traj.versions, "spans": [vars(s) for s in traj.spans], "reward": 1.0,
        "routed_experts": {"layers": 2, "top_k": 2, "experts": entries[:-1]}}]}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    short = httpx.post(f"{server.url}/v1/trajectories", json=body, headers=headers)
    assert short.status_code == 422
    assert short.json()["detail"] == (
        f"trajectories.0.routed_experts.experts: {len(entries) - 1} entries, expected "
        f"{len(traj.tokens)} tokens x 2 layers x 2")
    body["trajectories"][0]["routed_experts"]["experts"] = [*entries[:-1], 256]
    wide = httpx.post(f"{server.url}/v1/trajectories", json=body, headers=headers)
    assert wide.status_code == 422 and "must be in [0, 255]" in wide.json()["detail"]
    body["trajectories"][0]["routed_experts"]["experts"] = entries
    ok = httpx.post(f"{server.url}/v1/trajectories", json=body, headers=headers)
    assert ok.status_code == 200 and ok.json()["accepted"] == 1
    (item,) = c.get_batch("policy", 1, timeout=5).items
    assert item.trajectory.routed_experts == routed


def test_a_model_of_many_experts_takes_two_bytes_a_choice():
    experts = np.array([[[0, 300]], [[-1, -1]]])
    routed = from_array(experts, num_experts=384)
    assert routed.wide and len(routed.experts) == 2 * 2 * 2
    assert to_array(routed).tolist() == [[[0, 300]], [[65535, 65535]]]
    assert extend(routed, 3).positions == 3 and extend(routed, 1).positions == 1
    narrow = from_array(np.array([[[1, 2]]]), num_experts=8)
    assert not narrow.wide and narrow.experts == bytes([1, 2])
