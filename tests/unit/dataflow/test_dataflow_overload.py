"""Load shedding and heartbeat pacing: a data layer with more nodes than it can answer
grants what it keeps up with, refuses the rest at once with when to come back, and asks
a large pool to heartbeat less often."""

from __future__ import annotations

import math
import time

import pytest
from dataflow_helpers import group, wait_until

from astraflow.dataflow.overload import MAX_RETRY, REFUSALS_PER_SECOND, Overload


def gauge(value: int) -> tuple[list[int], Overload]:
    in_flight = [value]
    return in_flight, Overload(0.05, 1.0, lambda: in_flight[0])


def test_a_late_busy_loop_caps_the_leases_in_flight_below_what_it_could_not_serve():
    in_flight, overload = gauge(1000)
    assert math.isinf(overload.cap) and overload.admit()  # no cap before overload
    overload.decide(lag=0.1, busy=0.95, seconds=0.25)  # twice the lag limit: half
    assert overload.cap == 500
    assert not overload.admit() and overload.shed == 1
    # the cut shows only as leases end: no second cut within the cooldown
    overload.decide(lag=0.2, busy=0.95, seconds=0.25)
    assert overload.cap == 500
    in_flight[0] = 400  # leases ended: under the cap, granted again
    assert overload.admit()


def test_a_loop_late_because_neighbours_took_the_cpu_sheds_nothing():
    _, overload = gauge(1000)
    overload.decide(lag=0.5, busy=0.3, seconds=0.25)  # late, but the process was idle
    assert math.isinf(overload.cap)


def test_the_cap_rises_while_it_binds_and_the_loop_keeps_up():
    in_flight, overload = gauge(100)
    overload.cap = 100
    overload.decide(lag=0.01, busy=0.9, seconds=0.25)
    assert overload.cap == pytest.approx(110)
    in_flight[0] = 50  # not binding: nothing to learn
    overload.decide(lag=0.01, busy=0.9, seconds=0.25)
    assert overload.cap == pytest.approx(110)


def test_a_cut_is_not_undone_before_it_can_show(monkeypatch):
    # a cut shows only as the leases granted before it end (a rollout's time): raised
    # again meanwhile, the cap overshoots and the loop runs late once more -- the swing
    # that set the tail latency at 10,000 nodes
    from astraflow.dataflow import overload as module

    now = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    in_flight, overload = gauge(1000)
    overload.decide(lag=0.1, busy=0.95, seconds=0.25)
    assert overload.cap == 500
    in_flight[0] = 500
    for _ in range(3):  # binding, the loop keeping up: still held within the cooldown
        now[0] += 0.25
        overload.decide(lag=0.01, busy=0.9, seconds=0.25)
    assert overload.cap == 500
    now[0] += 0.25
    overload.decide(lag=0.01, busy=0.9, seconds=0.25)
    assert overload.cap == pytest.approx(550)


def test_refused_nodes_are_told_to_come_back_at_a_rate_the_loop_can_answer():
    _, overload = gauge(1000)
    overload.cap = 10  # far below what is in flight: every lease is refused
    advice = []
    for _ in range(12):  # 8,000 refusals a second, decision after decision
        for _ in range(2000):
            overload.admit()
        overload.decide(lag=0.01, busy=0.5, seconds=0.25)
        advice.append(overload.retry)
    assert advice == sorted(advice) and advice[-1] == MAX_RETRY
    spread = [overload.retry_after() for _ in range(200)]
    assert min(spread) >= 0.5 * MAX_RETRY and max(spread) <= 1.5 * MAX_RETRY
    assert max(spread) - min(spread) > 0.5 * MAX_RETRY  # they do not come back together
    for _ in range(3):  # as many as it can answer: the advice holds
        for _ in range(int(REFUSALS_PER_SECOND * 0.25)):
            overload.admit()
        overload.decide(lag=0.01, busy=0.5, seconds=0.25)
    assert overload.retry == MAX_RETRY
    for _ in range(100):  # nobody refused: back to the base advice
        overload.decide(lag=0.01, busy=0.5, seconds=0.25)
    assert overload.retry == 1.0


def test_an_overloaded_data_layer_refuses_leases_at_once_and_keeps_every_submission(
        start_server, connect):
    # the watcher off: the cap is set here as a late, busy loop would set it
    server = start_server(task={"name": "arithmetic"}, group_size=2, overload_lag=0)
    node = connect(server)
    node.register("raas")
    leases = node.lease_tasks(max_tasks=2)
    assert len(leases) == 2
    server.app.state.service.overload.cap = 2  # two in flight is all it keeps up with
    assert node.lease_tasks(max_tasks=1) == []
    assert "overloaded" in node.backpressure["*"]
    assert 0.5 <= node.overloaded_retry <= 1.5  # the base advice, spread
    # the loop still late: one in flight is all it keeps up with. The submission is
    # accepted; the lease it asks for with it is refused (its task still in flight)
    server.app.state.service.overload.cap = 1
    out = node.submit(leases[0], group(leases[0].task.task_id, [0.0, 1.0]), lease_more=1)
    assert out["status"] == "accepted" and out["leases"] == []
    node.submit(leases[1], group(leases[1].task.task_id, [1.0, 1.0]))
    # nothing in flight, under the cap: a lease is granted, and no retry advised
    assert len(node.lease_tasks(max_tasks=1)) == 1 and node.overloaded_retry is None
    st = node.status()
    assert st["overload"]["leases_shed"] == 2 and st["overload"]["lease_cap"] == 1
    assert st["trajectories"]["accepted"] == 4


def test_a_large_pool_is_asked_to_heartbeat_less_often_and_is_not_retired_for_it(
        start_server, connect):
    # 300 nodes beating every third of a 1.5 s timeout would be 600 beats a second: the
    # data layer asks for one every 3 s (100 a second) and retires after 9 s
    server = start_server(heartbeat_timeout=1.5)
    client = connect(server)
    first = client.register("raas", node_id="raas-first")
    assert client.heartbeat(first)["heartbeat_interval"] == 0.5  # one node: a third
    for i in range(299):
        client.register("raas", node_id=f"raas-{i}")
    started = time.monotonic()
    reply = client.heartbeat(first)
    assert reply["heartbeat_interval"] == pytest.approx(3.0)
    # past the 1.5 s timeout without a beat, every node is still active
    wait_until(lambda: time.monotonic() - started > 2.5, 10, "the base timeout to pass")
    pools = client.status()["pools"]
    assert pools["default"]["nodes"] == 300
