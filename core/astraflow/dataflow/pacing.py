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
from collections import deque
from collections.abc import Callable

#: weight of the newest measurement in the moving averages
ALPHA = 0.2
#: turnarounds kept, every node's, for their spread (:meth:`Pacing.turnaround_spread`)
RECENT = 256


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


class Pacing:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._interval: dict[str, float] = {}  # policy -> seconds between acks
        self._compute: dict[str, float] = {}  # policy -> seconds of a step, waits left out
        self._last_ack: dict[str, float] = {}
        self._turnaround: dict[str, float] = {}  # node id -> lease-to-accept seconds
        #: the slowest node's turnaround, None when it must be found again (a lease asks
        #: for it, and there may be 10,000 nodes: found again only when the slowest
        #: node got faster or left)
        self._slowest: float | None = None
        self._leased: dict[str, float] = {}  # task id -> when it was last leased
        self._recent: deque[float] = deque(maxlen=RECENT)  # every node's, newest last
        #: the last spread computed, until a turnaround arrives (read on every stale check)
        self._spread: tuple[float, float] | None = None

    def acked(self, policy: str, wait_seconds: float, step_seconds: float) -> None:
        if step_seconds <= 0:  # a batch acknowledged again after a restart: no step
            return
        now = self.clock()
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
        return max(interval, self.clock() - self._last_ack[policy])

    def fed_step_rate(self, policy: str) -> float | None:
        """Steps per second the trainer would take if it never waited for data."""
        compute = self._compute.get(policy)
        return None if compute is None else 1.0 / compute

    def leased(self, task_id: str) -> None:
        self._leased[task_id] = self.clock()

    def accepted(self, task_id: str, node_id: str) -> None:
        """``node_id`` submitted ``task_id``: one more turnaround measured."""
        since = self._leased.pop(task_id, None)
        if since is not None:
            seconds = max(self.clock() - since, 0.0)
            old = self._turnaround.get(node_id)
            new = self._turnaround[node_id] = _ewma(old, seconds)
            if self._slowest is not None and new >= self._slowest:
                self._slowest = new
            elif old is not None and old == self._slowest:
                self._slowest = None  # the slowest got faster
            self._recent.append(seconds)
            self._spread = None

    def turnaround_spread(self) -> tuple[float, float] | None:
        """The median and the 90th percentile of the last :data:`RECENT` turnarounds over
        every node (None before 16): how long a typical group takes and how much longer
        the slow ones do, which a mean hides. Kept until the next turnaround arrives."""
        if self._spread is None and len(self._recent) >= 16:
            ordered = sorted(self._recent)
            self._spread = (ordered[len(ordered) // 2], ordered[int(0.9 * len(ordered))])
        return self._spread

    def compute_interval(self, policy: str) -> float | None:
        """Seconds of a trainer step, its waits for data left out (None until a step)."""
        return self._compute.get(policy)

    def forget(self, before: float, node_ids: list[str]) -> None:
        """Drop leases made before ``before`` that never came back (their tasks were
        issued again or forgotten) and the turnarounds of departed nodes."""
        for task_id in [t for t, at in self._leased.items() if at < before]:
            del self._leased[task_id]
        for node_id in node_ids:
            if self._turnaround.pop(node_id, None) == self._slowest:
                self._slowest = None

    def turnaround(self, node_id: str) -> float | None:
        return self._turnaround.get(node_id)

    def steps_to_cover(self, policy: str) -> float | None:
        """Trainer steps, at its pace when fed, while the slowest node measured turns a
        task around: what the queue must hold for the trainer never to wait (None until
        a step and a turnaround are measured)."""
        compute = self._compute.get(policy)
        if compute is None or not self._turnaround:
            return None
        if self._slowest is None:
            self._slowest = max(self._turnaround.values())
        return self._slowest / compute

    def steps_meanwhile(self, policy: str, node_id: str) -> float:
        """Trainer steps expected while ``node_id`` rolls a task out (0 if unmeasured)."""
        interval, turnaround = self.step_interval(policy), self.turnaround(node_id)
        if not interval or turnaround is None:
            return 0.0
        return turnaround / interval
