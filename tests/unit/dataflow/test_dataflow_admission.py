"""Admission control as a pure function: a snapshot of what the data layer knows in,
the tasks a node may be issued and why not more out -- no server, no HTTP."""

from __future__ import annotations

from astraflow.dataflow.admission import UNLIMITED, PolicyView, Snapshot, admit


def snap(*, in_flight: int = 0, batch: int = 64, capacity: int = 1000, spare: int = 1,
         **views: PolicyView) -> Snapshot:
    return Snapshot(batch_size=batch, buffer_capacity=capacity, end_spare_batches=spare,
                    in_flight=in_flight, policies=views)


def test_a_fresh_run_issues_what_the_staleness_bound_can_train():
    # max_staleness=2: three batches of 64 may be queued ahead of a new sample, 8 a task
    grant = admit(snap(policy=PolicyView(max_staleness=2, samples_per_task=8)))
    assert (grant.tasks, grant.reasons) == (24, {})


def test_what_is_queued_and_in_flight_takes_its_share():
    view = PolicyView(max_staleness=2, samples_per_task=8, buffered=100, committing=12)
    # 192 - (100 + 12 + 5 tasks x 8) = 40 samples of room: 5 tasks
    assert admit(snap(in_flight=5, policy=view)).tasks == 5


def test_a_node_too_far_behind_is_told_to_refresh():
    grant = admit(snap(policy=PolicyView(max_staleness=2, samples_per_task=8, lag=3)))
    assert grant.tasks == 0
    assert grant.kinds == {"policy": "refresh_first"}
    assert "refresh first: the node's weights are 3 versions behind" in grant.reasons["policy"]


def test_a_node_slower_than_the_bound_is_told_its_turnaround():
    view = PolicyView(max_staleness=2, samples_per_task=8, buffered=64, meanwhile=4.2,
                      turnaround=8.4)
    grant = admit(snap(policy=view))
    assert grant.tasks == 0 and grant.kinds == {"policy": "turnaround"}
    assert grant.reasons["policy"].startswith("turnaround 8.40s: the trainer takes 4.2 steps")


def test_a_full_buffer_is_named():
    view = PolicyView(max_staleness=50, samples_per_task=8, buffered=995)
    grant = admit(snap(policy=view))
    assert grant.tasks == 0 and grant.kinds == {"policy": "buffer_full"}
    assert grant.reasons["policy"] == ("buffer full (995 buffered + 0 tasks in flight, "
                                       "capacity 1000)")


def test_with_no_staleness_allowed_the_next_batch_still_fills():
    # max_staleness=0 leaves room for one batch: 60 of its 64 samples are queued, and a
    # task of 8 would overshoot it; without that task the batch would wait forever
    view = PolicyView(max_staleness=0, samples_per_task=8, buffered=60)
    assert admit(snap(policy=view)).tasks == 1
    # a step running: the next batch waits for it, not for a task
    running = PolicyView(max_staleness=0, samples_per_task=8, buffered=60, running=1)
    assert admit(snap(policy=running)).tasks == 0


def test_a_step_running_uses_the_budget():
    view = PolicyView(max_staleness=1, samples_per_task=8, buffered=64, running=1)
    grant = admit(snap(policy=view))
    assert grant.tasks == 0 and grant.kinds == {"policy": "staleness"}


def test_the_runs_end_issues_nothing_past_its_last_batch():
    # one step left, one batch held: nothing more is needed
    view = PolicyView(max_staleness=2, samples_per_task=8, steps_left=1, held_batches=1)
    grant = admit(snap(policy=view))
    assert grant.tasks == 0 and grant.kinds == {"policy": "run_covered"}
    # two steps left: that step and one spare batch, 128 samples, 16 tasks
    view = PolicyView(max_staleness=2, samples_per_task=8, steps_left=2, held_batches=1)
    assert admit(snap(policy=view)).tasks == 16


def test_a_policy_whose_trainers_are_gone_holds_no_other_back():
    gone = PolicyView(max_staleness=0, samples_per_task=8, buffered=900, orphaned=True)
    live = PolicyView(max_staleness=2, samples_per_task=8)
    assert admit(snap(verifier=gone, solver=live)).tasks == 24
    grant = admit(snap(verifier=gone))
    assert grant.tasks == 0 and grant.kinds == {"verifier": "trainer_gone"}
    assert grant.reasons["verifier"].startswith("every trainer is gone")


def test_the_tightest_policy_sets_the_grant():
    loose = PolicyView(max_staleness=8, samples_per_task=8)
    tight = PolicyView(max_staleness=2, samples_per_task=8, buffered=128)
    assert admit(snap(solver=loose, verifier=tight)).tasks == 8
    assert admit(snap()).tasks == UNLIMITED


def test_a_wide_bound_is_not_a_queue_to_fill():
    # a bound of 12 allows 13 batches queued; the trainer steps 2.5 times while the
    # slowest node turns a task around, so 3 + 2 batches (320 samples) keep it fed:
    # 200 queued leave room for 15 tasks, not the 79 the bound alone would issue
    view = PolicyView(max_staleness=12, samples_per_task=8, buffered=200, cover=2.5)
    assert admit(snap(policy=view)).tasks == 15
    alone = PolicyView(max_staleness=12, samples_per_task=8, buffered=200)
    assert admit(snap(policy=alone)).tasks == 79
    full = PolicyView(max_staleness=12, samples_per_task=8, buffered=320, cover=2.5)
    grant = admit(snap(policy=full))
    assert grant.tasks == 0 and grant.kinds == {"policy": "enough_queued"}
    assert grant.reasons["policy"].startswith("enough queued: 320 samples cover the 3")


def test_enough_queued_never_starves_the_next_batch():
    # a turnaround far below a step: the queue must still hold the next batch
    view = PolicyView(max_staleness=3, samples_per_task=8, buffered=10, cover=0.01)
    assert admit(snap(policy=view)).tasks == (3 * 64 - 10) // 8


def test_a_refusal_names_what_binds_not_the_queue_limit():
    # the staleness bound leaves no room: that is the reason, whatever the queue limit
    stale = PolicyView(max_staleness=1, samples_per_task=8, buffered=64, running=1, cover=0.5)
    assert admit(snap(policy=stale)).kinds == {"policy": "staleness"}
    # the run's last steps are covered: that is the reason
    end = PolicyView(max_staleness=12, samples_per_task=8, buffered=320, cover=2.5,
                     steps_left=1, held_batches=1)
    assert admit(snap(policy=end)).kinds == {"policy": "run_covered"}
