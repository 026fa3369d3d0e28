"""The task queue on its own: leases that ended leave no deadline behind, and the
deadlines of the leases still out expire as before."""

from __future__ import annotations

from astraflow.dataflow.tasks import TaskQueue


def test_deadlines_of_finished_leases_do_not_pile_up():
    queue = TaskQueue(None)
    fresh, _ = queue.new_posted([{"task_id": f"t{i}", "prompt": "p"} for i in range(5001)])
    queue.hold(fresh)
    queue.enqueue(fresh)
    kept = queue.next_ready()
    queue.lease_out([kept], "node", deadline=100.0)  # one lease stays out
    for _ in range(5000):  # the others: leased with a long deadline, done at once
        rec = queue.next_ready()
        queue.lease_out([rec], "node", deadline=1e9)
        queue.reserve(rec)
        queue.complete(rec.task_id, 0.0)
    assert len(queue._expiry) <= 2 * 1 + 1024 + 1  # the heap holds the live lease, not 5001
    assert queue.in_flight() == 1
    assert queue.expire(now=50.0) == 0
    assert queue.expire(now=150.0) == 1 and queue.next_ready() is kept
