"""Per-policy buffers: staleness, admission control, order, batches, routing, filters."""

from __future__ import annotations

import sqlite3

import httpx
import pytest
from dataflow_helpers import TOKEN, group, make_trajectory

from astraflow.dataflow.client import DataflowError
from astraflow.types import Task


def _lease_and_submit(c, trajs_for):
    (lease,) = c.lease_tasks()
    return c.submit(lease, trajs_for(lease.task.task_id))


def test_stale_trajectories_are_dropped_and_counted(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2)
    c = connect(server)
    c.register("raas")
    _lease_and_submit(c, lambda t: group(t, [0.0, 1.0], version=0))
    _lease_and_submit(c, lambda t: group(t, [1.0, 0.0], version=1))
    assert c.status()["policies"]["policy"]["buffered"] == 4

    # the trainer moves to version 2: version-0 samples are 2 > max_staleness=1 behind
    assert c.announce_version("policy", 2)["dropped_stale"] == 2
    # and a result generated with version 0 that arrives now is dropped on arrival
    out = _lease_and_submit(c, lambda t: group(t, [1.0, 0.0], version=0))
    assert out["accepted"] == 0 and out["dropped_stale"] == 2
    st = c.status()["policies"]["policy"]
    assert (st["buffered"], st["dropped_stale"], st["accepted"]) == (2, 4, 4)
    batch = c.get_batch("policy", 2, timeout=1)
    assert {i.trajectory.metadata["accepted_at"] > 0 for i in batch.items} == {True}
    assert min(i.trajectory.min_version for i in batch.items) == 1
    with pytest.raises(DataflowError, match="only move forward"):
        c.announce_version("policy", 1)


def test_stale_drops_are_counted_per_rollout_pool_across_a_restart(start_server, connect):
    """Operators see which pool lags: drops on arrival and on a version bump, by pool."""
    settings = dict(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2)
    server = start_server(**settings)
    fast, slow = connect(server), connect(server)
    fast.register("raas", pool="gpu-fast")
    slow.register("raas", pool="cpu, far away")  # pool names are free text
    _lease_and_submit(fast, lambda t: group(t, [0.0, 1.0], version=1))
    _lease_and_submit(slow, lambda t: group(t, [1.0, 0.0], version=0))
    fast.announce_version("policy", 2)  # the slow pool's version-0 samples go
    assert fast.status()["policies"]["policy"]["dropped_stale_by_pool"] == {"cpu, far away": 2}
    server.stop()

    server = start_server(**settings)  # the counts and each buffered item's pool persist
    fast, slow = connect(server), connect(server)
    fast.register("raas", pool="gpu-fast")
    slow.register("raas", pool="cpu, far away")
    out = _lease_and_submit(slow, lambda t: group(t, [1.0, 0.0], version=0))
    assert out["dropped_stale"] == 2  # dropped on arrival
    fast.announce_version("policy", 3)  # the fast pool's buffered version-1 samples go
    st = fast.status()["policies"]["policy"]
    assert st["dropped_stale_by_pool"] == {"cpu, far away": 4, "gpu-fast": 2}
    assert st["dropped_stale"] == 6
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert 'astraflow_dropped_stale_total{policy="policy",pool="cpu, far away"} 4' in text


def test_a_store_from_before_per_pool_counts_keeps_its_items(start_server, connect,
                                                               tmp_path):
    settings = dict(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2)
    server = start_server(**settings)
    c = connect(server)
    c.register("raas", pool="gpu")
    _lease_and_submit(c, lambda t: group(t, [0.0, 1.0], version=0))
    server.stop()
    with sqlite3.connect(tmp_path / "store" / "dataflow.sqlite3") as conn:
        conn.execute("ALTER TABLE items DROP COLUMN pool")  # as the older store was

    server = start_server(**settings)
    c = connect(server)
    assert c.status()["policies"]["policy"]["buffered"] == 2
    c.announce_version("policy", 2)
    assert c.status()["policies"]["policy"]["dropped_stale_by_pool"] == {"unknown": 2}


def test_admission_control_applies_backpressure(start_server, connect):
    # batch 4, staleness 1: at most (1 + 1) * 4 = 8 samples may be queued ahead
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2,
                          batch_size=4)
    c = connect(server)
    c.register("raas")
    leases = c.lease_tasks(max_tasks=10)
    assert len(leases) == 4
    assert c.lease_tasks() == [] and "staleness" in c.backpressure["policy"]
    for lease in leases:
        c.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    assert c.lease_tasks() == []
    # consuming a batch makes room again
    batch = c.get_batch("policy", 4, timeout=1)
    c.ack_batch(batch.batch_id)
    assert len(c.lease_tasks(max_tasks=10)) == 2
    # a node whose weights are a version behind gets less room
    c.announce_version("policy", 1)
    assert c.lease_tasks(max_tasks=10, versions={"policy": 0}) == []


def test_bounded_buffer_refuses_instead_of_dropping(start_server, connect):
    server = start_server(policies={"policy": 100}, group_size=2, buffer_capacity=4)
    c = connect(server, retry_for=0.3)
    c.register("raas")
    c.post_tasks([Task(t, "p") for t in "abc"])
    a, b = c.lease_tasks(max_tasks=3)
    assert c.lease_tasks() == [] and "buffer full" in c.backpressure["policy"]
    c.submit(a, group("a", [0.0, 1.0]))
    # a workflow that returns more samples than expected would overflow: refused, not lost
    with pytest.raises(DataflowError) as err:
        c.submit(b, group("b", [0.0, 1.0, 1.0]))
    assert err.value.status == 429 and "full" in err.value.detail
    assert c.status()["policies"]["policy"]["buffered"] == 2
    c.ack_batch(c.get_batch("policy", 2, timeout=1).batch_id)
    assert c.submit(b, group("b", [0.0, 1.0, 1.0]))["accepted"] == 3


@pytest.mark.parametrize("order", ["fifo", "edf"])
def test_fifo_and_edf_order(start_server, connect, order):
    server = start_server(policies={"policy": 5}, order=order, group_size=1, batch_size=100)
    c = connect(server)
    c.register("raas")
    c.announce_version("policy", 4)
    c.post_tasks([Task(f"t{v}", "p") for v in (4, 2, 3)])
    for lease in c.lease_tasks(max_tasks=3):
        version = int(lease.task.task_id[1:])
        c.submit(lease, [make_trajectory(lease.task.task_id, version=version)])
    served = []
    for _ in range(3):
        batch = c.get_batch("policy", 1, timeout=1)
        served.append(batch.items[0].trajectory.task_id)
        c.ack_batch(batch.batch_id)
    # FIFO: arrival order; EDF: the sample closest to going stale (oldest version) first
    assert served == (["t4", "t2", "t3"] if order == "fifo" else ["t2", "t3", "t4"])


def test_unacknowledged_batch_is_served_again_after_trainer_restart(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=4)
    node = connect(server)
    node.register("raas")
    for lease in node.lease_tasks(max_tasks=2):
        trajs = group(lease.task.task_id, [0.0, 1.0, 0.0, 1.0])
        for k, t in enumerate(trajs):
            t.metadata["sample"] = f"{lease.task.task_id}/{k}"
        node.submit(lease, trajs)

    def samples(batch):
        return {i.trajectory.metadata["sample"] for i in batch.items}

    trainer = connect(server)
    first = trainer.get_batch("policy", 4, timeout=1, trainer_id="policy-0")
    trainer.close()  # the trainer dies mid-step

    restarted = connect(server)
    again = restarted.get_batch("policy", 4, timeout=1, trainer_id="policy-0")
    assert again.batch_id == first.batch_id and again.metadata["redelivered"]
    assert samples(again) == samples(first) and len(samples(first)) == 4
    assert restarted.ack_batch(again.batch_id, wait_seconds=0.1, step_seconds=1)["consumed"] == 4
    assert restarted.ack_batch(again.batch_id)["status"] == "duplicate"
    nxt = restarted.get_batch("policy", 4, timeout=1, trainer_id="policy-0")
    assert nxt.batch_id != first.batch_id and not samples(nxt) & samples(first)
    assert restarted.get_batch("policy", 4, timeout=0.2, trainer_id="policy-1") is None
    st = restarted.status()["policies"]["policy"]
    assert (st["consumed"], st["buffered"], st["outstanding_batches"]) == (4, 0, 1)


def test_a_batch_fetched_ahead_is_composed_for_the_version_it_will_be_trained_at(
        start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2)
    c = connect(server)
    c.register("raas")
    c.announce_version("policy", 1)
    for version in (0, 0, 1):  # two groups one version behind, one current
        _lease_and_submit(c, lambda t, v=version: group(t, [0.0, 1.0], version=v))

    def versions(batch):
        return {i.trajectory.min_version for i in batch.items}

    trainer = connect(server)
    first = trainer.get_batch("policy", 2, timeout=1, trainer_id="t")
    assert (first.trainer_version, versions(first)) == (1, {0})
    # fetched while the first trains: it is trained at version 2, where max_staleness=1
    # excludes the other version-0 group, so it gets the current one
    ahead = trainer.get_batch("policy", 2, timeout=1, trainer_id="t", after=first.batch_id)
    assert (ahead.trainer_version, versions(ahead)) == (2, {1})
    assert c.status()["policies"]["policy"]["outstanding_batches"] == 2
    with pytest.raises(DataflowError, match="already holds 2 unacknowledged") as err:
        trainer.get_batch("policy", 2, timeout=0.1, trainer_id="t", after=ahead.batch_id)
    assert err.value.status == 409

    # a restarted trainer is served both again, in order, and then nothing new
    restarted = connect(server)
    again = restarted.get_batch("policy", 2, timeout=1, trainer_id="t")
    assert again.batch_id == first.batch_id and again.metadata["redelivered"]
    after = restarted.get_batch("policy", 2, timeout=1, trainer_id="t", after=again.batch_id)
    assert after.batch_id == ahead.batch_id
    restarted.ack_batch(first.batch_id)
    # asked after a batch already acknowledged (its reply came late), the next held one
    assert restarted.get_batch("policy", 2, timeout=1, trainer_id="t",
                               after=first.batch_id).batch_id == ahead.batch_id
    # the step publishes version 2: the version-0 group left behind is dropped as stale
    assert c.announce_version("policy", 2)["dropped_stale"] == 2
    restarted.ack_batch(ahead.batch_id)
    st = c.status()["policies"]["policy"]
    assert (st["consumed"], st["buffered"], st["outstanding_batches"]) == (4, 0, 0)


def test_multi_policy_routing_with_token_masks(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"solver": 2, "verifier": 2},
                          group_size=2)
    c = connect(server)
    c.register("raas", policies=["solver", "verifier"])
    (lease,) = c.lease_tasks()
    tid = lease.task.task_id
    solver = [make_trajectory(tid, "solver", r, group_id="s") for r in (0.0, 1.0)]
    # the verifier reads the solver's answer as context: those tokens are never trained
    verifier = [make_trajectory(tid, "verifier", r, group_id="v", context="solver")
                for r in (1.0, 1.0, 0.0)]
    assert c.submit(lease, solver + verifier)["accepted"] == 5

    s = c.get_batch("solver", 2, timeout=1)
    v = c.get_batch("verifier", 3, timeout=1)
    assert {i.trajectory.policy for i in s.items} == {"solver"}
    assert {i.trajectory.policy for i in v.items} == {"verifier"}
    for item in v.items:
        t = item.trajectory
        context = next(sp for sp in t.spans if sp.source == "solver")
        assert set(t.loss_mask[context.start:context.end]) == {0}
        assert sum(t.loss_mask) == 5
    # advantages are normalised within each (group, policy)
    assert sorted(round(i.advantage, 3) for i in s.items) == [-1.0, 1.0]
    assert sorted(round(i.advantage, 3) for i in v.items) == [-1.414, 0.707, 0.707]
    assert c.get_batch("solver", 1, timeout=0.1) is not None  # same outstanding batch


def test_mask_on_another_policys_tokens_is_rejected(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, policies={"solver": 2, "verifier": 2})
    c = connect(server)
    c.register("raas")
    (lease,) = c.lease_tasks()
    bad = make_trajectory(lease.task.task_id, "verifier", context="solver")
    bad.loss_mask = [1] * len(bad.tokens)
    bad.versions = [0] * len(bad.tokens)
    with pytest.raises(DataflowError) as err:
        c.submit(lease, [bad])
    assert err.value.status == 422 and "source 'prompt'" in err.value.detail
    unknown = make_trajectory(lease.task.task_id, "critic")
    with pytest.raises(DataflowError, match="unknown policy 'critic'"):
        c.submit(lease, [unknown])
    assert c.status()["trajectories"]["accepted"] == 0


def test_dynamic_sampling_drops_equal_reward_groups(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=3,
                          data={"dynamic_sampling": {}})
    c = connect(server)
    c.register("raas")
    flat = _lease_and_submit(c, lambda t: group(t, [1.0, 1.0, 1.0]))
    mixed = _lease_and_submit(c, lambda t: group(t, [1.0, 0.0, 1.0]))
    assert (flat["accepted"], flat["filtered"]) == (0, 3)
    assert (mixed["accepted"], mixed["filtered"]) == (3, 0)
    st = c.status()
    assert st["trajectories"]["filtered"] == 3 and st["tasks"]["completed"] == 2


def test_failed_rewards_get_no_advantage_and_are_counted(start_server, connect):
    """A sample whose reward raised carries no judgement: zero advantage, left out of its
    group's mean and std, and counted with its first traceback in the status."""
    from astraflow.rewards.base import ERROR, FAILED
    from astraflow.rl.advantages import group_advantages

    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=4)
    c = connect(server)
    c.register("raas")

    def with_failures(task_id):
        trajs = group(task_id, [1.0, 0.0, 0.0, 0.0])
        for traj in trajs[2:]:
            traj.metadata.update({FAILED: True, ERROR: "Traceback ...\nKeyError: 'x'"})
        return trajs

    _lease_and_submit(c, with_failures)
    batch = c.get_batch("policy", 4, timeout=5)
    advantages = sorted(item.advantage for item in batch.items)
    expected = sorted([*group_advantages([1.0, 0.0]), 0.0, 0.0])
    assert advantages == pytest.approx(expected)
    st = c.status()["policies"]["policy"]
    assert (st["reward_failed"], st["produced"]) == (2, 4)
    assert st["first_reward_error"].endswith("KeyError: 'x'")


def test_no_task_is_issued_whose_samples_a_running_step_would_make_stale(start_server,
                                                                         connect):
    # batch 4, staleness 1, 2 samples a task. While the trainer trains on a batch, the
    # samples queued behind it are consumed one version later than they would be with
    # no step running: a node that leases then must not be issued what would arrive
    # two versions old (generated only to be dropped).
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2,
                          batch_size=4)
    # what is tested is the step running, not the trainer's pace: with the wall clock,
    # a loaded machine made the measured pace refuse leases (a batch of None)
    server.service.pacing.clock = lambda: 1000.0
    c = connect(server)
    c.register("raas")
    for version in range(6):
        for lease in c.lease_tasks(max_tasks=10, versions={"policy": version}):
            c.submit(lease, group(lease.task.task_id, [0.0, 1.0], version=version))
        batch = c.get_batch("policy", 4, timeout=1)
        assert batch is not None
        # the step runs: whatever a node leases now waits behind it
        for lease in c.lease_tasks(max_tasks=10, versions={"policy": version}):
            c.submit(lease, group(lease.task.task_id, [0.0, 1.0], version=version))
        c.announce_version("policy", version + 1)
        acked = c.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=0.1)
    info = c.status()["policies"]["policy"]
    # what the trainer records after each step comes with the acknowledgement
    assert acked["ledger"] == {"generated": info["generated"], "trained_fraction": 1.0,
                               "dropped_stale_by_pool": {}, "reward_failed": 0,
                               "cancelled": 0}
    assert info["dropped_stale"] == 0
    assert info["trained"] == 6 * 4
    assert info["trained_fraction"] == 1.0
    assert info["generated"] == info["trained"] + info["pending"]
    assert info["by_pool"]["default"] == {"generated": info["generated"],
                                          "trained": info["trained"], "dropped_stale": 0,
                                          "pending": info["pending"], "trained_fraction": 1.0}


def test_a_node_slower_than_the_staleness_bound_is_told_so_until_the_trainer_slows(
        start_server, connect):
    # a trainer stepping every 0.05 s, fed by a fast node, and a slow node taking 0.4 s
    # per task: with max_staleness=1 the slow node's samples would arrive ~8 versions
    # old, so it is issued nothing and told why; once the trainer has not stepped for a
    # while, it is issued tasks again. The data layer's clock is the test's, so the
    # durations are exact and nothing sleeps.
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 1}, group_size=2,
                          batch_size=2)
    now = [1000.0]
    server.service.pacing.clock = lambda: now[0]
    trainer, fast, slow = connect(server), connect(server), connect(server)
    fast.register("raas")
    slow.register("raas")
    (lease,) = slow.lease_tasks(max_tasks=1)
    now[0] += 0.4  # the slow node's rollout
    slow.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    for version in range(1, 6):
        batch = trainer.get_batch("policy", 2, timeout=1)
        trainer.announce_version("policy", version)
        trainer.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=0.05)
        (fill,) = fast.lease_tasks(max_tasks=1, versions={"policy": version})
        fast.submit(fill, group(fill.task.task_id, [0.0, 1.0], version=version))
        now[0] += 0.05  # the trainer's step
    assert slow.lease_tasks(max_tasks=1, versions={"policy": 5}) == []
    assert "turnaround" in slow.backpressure["policy"]
    assert slow.status()["policies"]["policy"]["admission_refusals"]["turnaround"] >= 1
    now[0] += 1.0  # the trainer has not stepped for a second: it would wait for data
    assert slow.lease_tasks(max_tasks=1, versions={"policy": 5})
