"""Task leasing: deadlines, re-issue, idempotent submission, node life cycle."""

from __future__ import annotations

import pytest
from dataflow_helpers import group, wait_until

from astraflow.dataflow.client import DataflowError
from astraflow.types import Task


def test_expired_lease_is_reissued_and_first_result_wins(start_server, connect):
    server = start_server(lease_seconds=0.5, group_size=2)
    a, b = connect(server), connect(server)
    a.register("raas", pool="p1")
    b.register("raas", pool="p1")
    a.post_tasks([Task("only", "3+4=", "7")])
    (lease,) = a.lease_tasks(max_tasks=1)
    assert lease.group_size == 2 and lease.deadline > 0
    assert b.lease_tasks(max_tasks=1) == []

    # node a goes quiet: once the deadline passes the same task goes to node b
    (again,) = wait_until(lambda: b.lease_tasks(max_tasks=1, wait=1.0), what="re-issue")
    assert again.task.task_id == lease.task.task_id
    assert again.lease_id != lease.lease_id
    assert b.status()["tasks"]["reissued"] == 1

    # the late node finishes first: its result is accepted, b's becomes a duplicate
    task_id = lease.task.task_id
    assert a.submit(lease, group(task_id, [0.0, 1.0]))["status"] == "accepted"
    assert b.submit(again, group(task_id, [1.0, 1.0]))["status"] == "duplicate"
    st = b.status()
    assert st["tasks"]["completed"] == 1
    assert st["trajectories"]["accepted"] == 2
    assert st["tasks"]["duplicate_submissions"] == 1


def test_submission_is_idempotent(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=4)
    c = connect(server)
    c.register("raas")
    leases = c.lease_tasks(max_tasks=3)
    assert len({lease.task.task_id for lease in leases}) == 3
    for lease in leases:
        trajs = group(lease.task.task_id, [0.0, 1.0, 0.0, 1.0])
        assert c.submit(lease, trajs)["accepted"] == 4
        for _ in range(3):
            assert c.submit(lease, trajs) == {"status": "duplicate",
                                              "task_id": lease.task.task_id}
    st = c.status()
    assert st["tasks"]["completed"] == 3
    assert st["policies"]["policy"]["accepted"] == 12
    assert st["policies"]["policy"]["buffered"] == 12
    batch = c.get_batch("policy", 12, timeout=2)
    assert len({(i.trajectory.task_id, i.trajectory.reward, i.advantage) for i in batch.items}) == 6


def test_wrong_lease_and_wrong_task_are_refused(start_server, connect):
    server = start_server(task={"name": "arithmetic"})
    c = connect(server)
    c.register("raas")
    (lease,) = c.lease_tasks()
    for bad_lease, status in ((f"{lease.task.task_id}|7", 409), ("nope|1", 404),
                              ("no-attempt", 422)):
        try:
            c.submit(bad_lease, group(lease.task.task_id, [1.0]))
        except Exception as exc:
            assert exc.status == status and exc.detail
        else:
            raise AssertionError(f"{bad_lease} was accepted")
    try:
        c.submit(lease, group("another-task", [1.0]))
    except Exception as exc:
        assert exc.status == 422 and "the lease is for" in exc.detail
    else:
        raise AssertionError("a trajectory of another task was accepted")
    assert c.status()["trajectories"]["accepted"] == 0


def test_missing_heartbeats_retire_a_node_and_free_its_leases(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, heartbeat_timeout=0.4,
                          lease_seconds=60)
    quiet, live = connect(server), connect(server)
    quiet.register("raas", pool="gpu", region="eu")
    live.register("raas", pool="gpu", region="us")
    (held,) = quiet.lease_tasks()

    def retired() -> bool:
        live.heartbeat()
        states = {n["node_id"]: n["state"] for n in live.status()["nodes"]}
        return states[quiet.node_id] == "retired"

    wait_until(retired, what="the quiet node to be retired")
    # its lease is re-issued long before the 60 s deadline
    (lease,) = live.lease_tasks()
    assert lease.task.task_id == held.task.task_id
    assert live.status()["pools"]["gpu"]["nodes"] == 1
    # a retired node that comes back registers again by itself on its next heartbeat
    quiet.heartbeat()
    assert live.status()["pools"]["gpu"]["nodes"] == 2


def test_leaving_node_releases_leases(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, lease_seconds=60)
    a, b = connect(server), connect(server)
    a.register("raas")
    b.register("raas")
    held = {lease.task.task_id for lease in a.lease_tasks(max_tasks=2)}
    a.leave()
    assert {lease.task.task_id for lease in b.lease_tasks(max_tasks=2)} == held
    try:
        a.lease_tasks()
    except Exception as exc:
        assert exc.status == 404 and "register again" in exc.detail


def test_posted_tasks_and_long_poll_for_work(start_server, connect):
    server = start_server(lease_seconds=30)
    c = connect(server)
    c.register("raas")
    assert c.lease_tasks(wait=0) == []
    assert c.backpressure
    out = c.post_tasks([Task("t1", "1+1=", "2"), Task("t2", "2+2=", "4")])
    assert out == {"accepted": 2, "duplicates": []}
    assert c.post_tasks([Task("t1", "1+1=", "2")]) == {"accepted": 0, "duplicates": ["t1"]}
    leases = c.lease_tasks(max_tasks=5, wait=1)
    assert [lease.task.task_id for lease in leases] == ["t1", "t2"]
    assert c.status()["tasks"]["posted"] == 2


def test_a_submission_can_lease_the_next_tasks_in_the_same_round_trip(start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=2)
    node = connect(server)
    node.register("raas")
    (first,) = node.lease_tasks(max_tasks=1)
    out = node.submit(first, group(first.task.task_id, [0.0, 1.0]), lease_more=2)
    assert out["status"] == "accepted" and len(out["leases"]) == 2
    nxt = out["leases"][0]
    assert nxt.task.task_id != first.task.task_id
    assert node.submit(nxt, group(nxt.task.task_id, [1.0, 0.0]))["status"] == "accepted"
    st = node.status()["tasks"]
    assert (st["leased"], st["completed"], st["in_flight"]) == (3, 2, 1)

    # a refused submission leases nothing
    (bad,) = node.lease_tasks(max_tasks=1)
    with pytest.raises(DataflowError, match="task_id"):
        node.submit(bad, group("another-task", [0.0, 1.0]), lease_more=4)
    assert node.status()["tasks"]["leased"] == 4
    # a duplicate still gets work: the node is idle otherwise
    again = node.submit(first, group(first.task.task_id, [0.0, 1.0]), lease_more=1)
    assert again["status"] == "duplicate" and len(again["leases"]) == 1

    # leasing needs to know for whom
    with pytest.raises(DataflowError, match="node_id"):
        connect(server).submit(bad, group(bad.task.task_id, [0.0, 1.0]), lease_more=1)
    # a node the service retired meanwhile keeps its accepted submission, gets no lease
    node.leave()
    gone = node.submit(bad, group(bad.task.task_id, [0.0, 1.0]), lease_more=1)
    assert gone["status"] == "accepted" and gone["leases"] == []
    assert "register" in next(iter(gone["backpressure"].values()))


def test_once_every_trainer_left_no_task_is_issued_until_one_returns(start_server, connect):
    """The run is over (the trainer left after its last step) while nodes still serve
    the final evaluation: a task leased now could only be generated to be dropped."""
    server = start_server(task={"name": "arithmetic"}, group_size=2)
    node, trainer = connect(server), connect(server)
    node.register("raas")
    trainer.register("trainer", policies=["policy"])
    assert len(node.lease_tasks(max_tasks=2)) == 2
    trainer.leave()
    assert node.lease_tasks(max_tasks=2) == []
    assert "every trainer is gone" in node.backpressure["policy"]
    st = node.status()
    assert st["policies"]["policy"]["trainer_gone"] is True
    assert st["policies"]["policy"]["admission_refusals"]["trainer_gone"] >= 1
    # a trainer that comes back (a restart) reopens admission
    trainer.register("trainer", policies=["policy"])
    assert len(node.lease_tasks(max_tasks=2)) == 2


def test_no_task_is_issued_past_the_steps_the_trainer_has_left(start_server, connect):
    """At a run's end the nodes are not kept generating batches no step will take: the
    trainer says at each acknowledgement how many steps it has left."""
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 10},
                          group_size=2, batch_size=4, end_spare_batches=0)
    node, trainer = connect(server), connect(server)
    node.register("raas")
    trainer.register("trainer", policies=["policy"])

    def roll_out(max_tasks):
        leases = node.lease_tasks(max_tasks=max_tasks)
        for lease in leases:
            node.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
        return len(leases)

    assert roll_out(4) == 4  # before the trainer says anything: as admission allows
    batch = trainer.get_batch("policy", 4, timeout=1)
    trainer.ack_batch(batch.batch_id, step_seconds=0.1, steps_left=2)
    # two steps left, one batch queued: the tasks of one more batch, not one more
    assert roll_out(10) == 2
    assert roll_out(10) == 0
    assert "enough for the run" in node.backpressure["policy"]
    batch = trainer.get_batch("policy", 4, timeout=1)
    trainer.ack_batch(batch.batch_id, step_seconds=0.1, steps_left=1)
    assert roll_out(10) == 0
    last = trainer.get_batch("policy", 4, timeout=1)
    trainer.ack_batch(last.batch_id, step_seconds=0.1, steps_left=0)
    st = node.status()["policies"]["policy"]
    assert st["buffered"] == 0 and st["consumed"] == 12
    assert st["admission_refusals"]["run_covered"] >= 2


def test_a_runs_last_batches_take_the_first_groups_back_from_a_spare_batch(start_server,
                                                                           connect):
    """``end_spare_batches=1``: at a run's end one batch more than the steps left is
    issued, so the last batch is not held by its slowest group; the spare is left over."""
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 10},
                          group_size=2, batch_size=4, end_spare_batches=1)
    node, trainer = connect(server), connect(server)
    node.register("raas")
    trainer.register("trainer", policies=["policy"])
    first = node.lease_tasks(max_tasks=2)
    for lease in first:
        node.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    batch = trainer.get_batch("policy", 4, timeout=1)
    trainer.ack_batch(batch.batch_id, step_seconds=0.1, steps_left=1)
    # one step left: its batch's two tasks and a spare batch's two
    leases = node.lease_tasks(max_tasks=10)
    assert len(leases) == 4
    assert node.lease_tasks(max_tasks=10) == []
    assert "enough for the run" in node.backpressure["policy"]
    # the two that come back first make the last batch; the slow two need not come
    for lease in leases[2:]:
        node.submit(lease, group(lease.task.task_id, [1.0, 0.0]))
    last = trainer.get_batch("policy", 4, timeout=1)
    assert {i.trajectory.task_id for i in last.items} == {lease.task.task_id
                                                          for lease in leases[2:]}
    trainer.ack_batch(last.batch_id, step_seconds=0.1, steps_left=0)
    assert node.lease_tasks(max_tasks=10) == []  # the run needs nothing more
