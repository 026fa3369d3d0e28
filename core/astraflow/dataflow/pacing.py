"""What admission control plans with: how fast each trainer consumes, and how long each
node takes to turn a lease into a submission.

Both are measured, not configured. A trainer's pace is the interval between its
acknowledgements (waits included: a starving trainer steps no faster than data comes),
and a node's turnaround is the time from a lease to its accepted submission (so a
remote pool's network and an agent's tool latency are in it). A sample leased to a
node of turnaround ``T`` is consumed no sooner than ``T / interval`` trainer steps
later, whatever the queue in front of it: the bound that keeps a slow pool from
producing samples that would arrive too stale to train on.
"""

from __future__ import annotations

import time

#: weight of the newest measurement in the moving averages
ALPHA = 0.2


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


class Pacing:
    def __init__(self) -> None:
        self._interval: dict[str, float] = {}  # policy -> seconds between acks
        self._compute: dict[str, float] = {}  # policy -> seconds of a step, waits left out
        self._last_ack: dict[str, float] = {}
        self._turnaround: dict[str, float] = {}  # node id -> lease-to-accept seconds

    def acked(self, policy: str, wait_seconds: float, step_seconds: float) -> None:
        if step_seconds <= 0:  # a batch acknowledged again after a restart: no step
            return
        now = time.monotonic()
        last = self._last_ack.get(policy)
        if last is not None:
            self._interval[policy] = _ewma(self._interval.get(policy), now - last)
        self._last_ack[policy] = now
        self._compute[policy] = _ewma(self._compute.get(policy),
                                      max(step_seconds - wait_seconds, 1e-3))

    def step_interval(self, policy: str) -> float | None:
        """Seconds per trainer step now: the average interval, stretched by the time
        since the last step when that is longer (a trainer that stopped consuming)."""
        interval = self._interval.get(policy)
        if interval is None:
            return None
        return max(interval, time.monotonic() - self._last_ack[policy])

    def fed_step_rate(self, policy: str) -> float | None:
        """Steps per second the trainer would take if it never waited for data."""
        compute = self._compute.get(policy)
        return None if compute is None else 1.0 / compute

    def task_done(self, node_id: str, seconds: float) -> None:
        self._turnaround[node_id] = _ewma(self._turnaround.get(node_id), max(seconds, 0.0))

    def turnaround(self, node_id: str) -> float | None:
        return self._turnaround.get(node_id)

    def steps_meanwhile(self, policy: str, node_id: str) -> float:
        """Trainer steps expected while ``node_id`` rolls a task out (0 if unmeasured)."""
        interval, turnaround = self.step_interval(policy), self.turnaround(node_id)
        if not interval or turnaround is None:
            return 0.0
        return turnaround / interval
