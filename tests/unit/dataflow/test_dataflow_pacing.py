"""Pacing: the data layer tells each node the rate that keeps the trainers fed, and a
node keeps rate x turnaround tasks in flight (Little's law), bounded by its concurrency."""

from __future__ import annotations

import pytest
from dataflow_helpers import group

from astraflow.raas.node import START_IN_FLIGHT, in_flight_target


def test_lease_replies_carry_each_nodes_share_of_what_the_trainer_consumes(start_server,
                                                                           connect):
    # batch 4 of 2-sample tasks: a trainer step of 0.2 s of compute (0.1 s of its 0.3 s
    # was waiting) consumes 20 samples/s, 10 tasks/s, 5 for each of two nodes
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 2}, group_size=2,
                          batch_size=4)
    trainer, a, b = connect(server), connect(server), connect(server)
    a.register("raas")
    b.register("raas")
    leases = a.lease_tasks(max_tasks=2)
    assert a.pace["tasks_per_second"] is None  # no step yet: nothing measured
    for lease in leases:
        a.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    trainer.ack_batch(trainer.get_batch("policy", 4, timeout=1).batch_id,
                      wait_seconds=0.1, step_seconds=0.3)
    b.lease_tasks(max_tasks=3)
    assert b.pace["tasks_per_second"] == pytest.approx(5.0)
    nodes = {n["node_id"]: n for n in trainer.status()["nodes"]}
    assert nodes[b.node_id]["in_flight"] == 3 and nodes[a.node_id]["in_flight"] == 0
    # a's leases came back: its turnaround is measured, b's not yet
    assert nodes[a.node_id]["turnaround_seconds"] > 0
    assert nodes[b.node_id]["turnaround_seconds"] is None


def test_a_node_keeps_rate_times_turnaround_in_flight_within_its_bound():
    # 5 tasks/s taking 2 s each: 10 in flight keep up; half again for jitter, plus one
    assert in_flight_target(5.0, 2.0, cap=64) == 16
    # ten times the latency, ten times the tasks in flight, up to the bound
    assert in_flight_target(5.0, 20.0, cap=256) == 151
    assert in_flight_target(5.0, 20.0, cap=64) == 64
    assert in_flight_target(5.0, 0.01, cap=64) == 2
    # nothing measured yet: a start that does not flood a slow workload
    assert in_flight_target(None, 2.0, cap=64) == START_IN_FLIGHT < 64
    assert in_flight_target(5.0, None, cap=64) == START_IN_FLIGHT
    assert in_flight_target(None, None, cap=4) == 4


def test_an_unset_staleness_bound_follows_the_slow_groups_and_a_set_one_stays():
    """policies.<name>.max_staleness unset: 3, + the trainer steps the slow groups (90th
    percentile) take beyond the median one, at most 16; set, it is what was set."""
    from astraflow.dataflow.pacing import Pacing
    from astraflow.dataflow.versions import DERIVED_MAX, DERIVED_MIN, Versions

    now = [0.0]
    pacing = Pacing(clock=lambda: now[0])
    versions = Versions({"auto": None, "fixed": 3}, lambda policy: (
        pacing.turnaround_spread(), pacing.compute_interval(policy)))
    assert versions.max_staleness("auto") == DERIVED_MIN  # nothing measured yet
    assert "until turnarounds and a trainer step are measured" in \
        versions.staleness_reason("auto")

    def groups(seconds: list[float]) -> None:
        for i, s in enumerate(seconds):
            pacing.leased(f"t{i}")
            now[0] += s
            pacing.accepted(f"t{i}", "node")

    for policy in ("auto", "fixed"):  # steps of 0.2 s, 0.1 s of it spent waiting
        pacing.acked(policy, wait_seconds=0.0, step_seconds=0.1)
        pacing.acked(policy, wait_seconds=0.1, step_seconds=0.2)
    groups([0.05] * 100)  # a compute-bound job: groups back within a step
    assert versions.max_staleness("auto") == DERIVED_MIN
    groups([3.0] * 256)  # slow but alike (a remote pool): admission covers it, not the bound
    assert versions.max_staleness("auto") == DERIVED_MIN
    # an environment with a long tail: one group in five takes 0.7 s more, 7 steps
    groups([0.05, 0.05, 0.05, 0.05, 0.75] * 60)
    assert versions.max_staleness("auto") == 10  # 3 + 7
    assert versions.staleness_reason("auto") == (
        "derived: 3 + the steps of 0.100 s that slow groups (90th percentile, 0.75 s) take "
        "beyond the median one (0.05 s): 7.0; at most 16")
    # a sample 8 versions behind: trained under the derived bound, dropped under the set one
    for policy in ("auto", "fixed"):
        versions.advance(policy, 10)
    assert not versions.stale("auto", 2) and versions.stale("fixed", 2)
    assert versions.max_staleness("fixed") == 3
    assert versions.staleness_reason("fixed").startswith("set")
    # the tail gone: admission plans with 3 again, but what was issued under 10 is not
    # dropped for it
    groups([0.05] * 256)
    assert versions.max_staleness("auto") == DERIVED_MIN
    assert not versions.stale("auto", 0)  # 10 behind at version 10
    versions.advance("auto", 12)
    assert versions.stale("auto", 1)  # 11 behind: past the highest bound
    groups([0.05, 0.05, 0.05, 0.05, 30.0] * 60)  # some groups take minutes: the ceiling
    assert versions.max_staleness("auto") == DERIVED_MAX


def test_the_widest_derived_bound_outlives_a_data_layer_restart(tmp_path):
    """Samples admitted under a bound widened to 10 are still trainable after the data
    layer restarts, before any turnaround is measured again (the bound alone would be 3)."""
    import sqlite3

    from astraflow.dataflow.pacing import Pacing
    from astraflow.dataflow.store import SCHEMA
    from astraflow.dataflow.versions import DERIVED_MIN, Versions

    now = [0.0]
    pacing = Pacing(clock=lambda: now[0])
    before = Versions({"auto": None}, lambda policy: (
        pacing.turnaround_spread(), pacing.compute_interval(policy)))
    pacing.acked("auto", wait_seconds=0.0, step_seconds=0.1)
    pacing.acked("auto", wait_seconds=0.1, step_seconds=0.2)
    for i, seconds in enumerate([0.05, 0.05, 0.05, 0.05, 0.8] * 60):
        pacing.leased(f"t{i}")
        now[0] += seconds
        pacing.accepted(f"t{i}", "node")
    assert before.max_staleness("auto") == 10
    before.advance("auto", 10)
    conn = sqlite3.connect(tmp_path / "state.db")
    conn.executescript(SCHEMA)
    conn.execute("INSERT INTO versions(policy, version) VALUES ('auto', 10)")
    before.save(conn)
    conn.commit()

    after = Versions({"auto": None}, None)  # restarted: nothing measured
    after.load(sqlite3.connect(tmp_path / "state.db"))
    assert after["auto"] == 10 and after.max_staleness("auto") == DERIVED_MIN
    assert not after.stale("auto", 0)  # 10 behind
    after.advance("auto", 11)
    assert after.stale("auto", 0)  # 11 behind: past the widest bound


def test_the_queue_covers_the_slowest_turnaround_at_the_fed_pace():
    from astraflow.dataflow.pacing import Pacing

    now = [0.0]
    pacing = Pacing(clock=lambda: now[0])
    assert pacing.steps_to_cover("policy") is None  # nothing measured
    pacing.acked("policy", wait_seconds=0.3, step_seconds=0.5)  # 0.2 s when fed
    for task, node, seconds in (("t1", "fast", 0.1), ("t2", "slow", 1.0)):
        pacing.leased(task)
        now[0] += seconds
        pacing.accepted(task, node)
    # the slow node's 1 s is 5 steps of 0.2 s: the waits do not shorten what is covered
    assert pacing.steps_to_cover("policy") == pytest.approx(5.0)
    pacing.leased("t3")  # the slow node gets faster: 1 s + 0.2 x (0.1 s - 1 s)
    now[0] += 0.1
    pacing.accepted("t3", "slow")
    assert pacing.steps_to_cover("policy") == pytest.approx(0.82 / 0.2)
    pacing.forget(before=-1.0, node_ids=["slow"])  # it left
    assert pacing.steps_to_cover("policy") == pytest.approx(0.5)
