"""Load shedding: a data layer that has more nodes asking than it can answer grants no
more leases than it keeps up with, refuses the rest at once, and tells the refused nodes
when to come back, instead of answering everyone late.

Every node's slot is a closed loop (lease -> roll out -> submit, which leases the next),
so ten thousand nodes with short rollouts can ask for more leases a second than one
event loop can serve. Queued, every request waits behind all the others and the latency
of every call grows with the number of nodes; shed, the granted ones are answered at
once and the rest sleep. The signal is the event loop's own lag (a timer's lateness)
while the process is busy on the CPU: lateness from neighbours on the machine taking
the CPU away is not overload, and shedding would not mend it.

Two controls, decided every DECIDE seconds:

* a cap on the leases in flight, none until the loop first runs late; at a late
  decision (the mean lag over its samples past the limit; at most one a COOLDOWN)
  lowered to what is in flight times the lag limit over the lag seen (at most halved),
  at each decision it binds without the loop running late raised by a tenth
  (the gradient rule of Netflix's concurrency limits), but not within COOLDOWN of a
  cut (raised before the cut can show, it swings around the loop's capacity) -- leases
  over it are refused, those a submission asks for too;
* the ``retry_after`` a refused node is told (spread over x[0.5, 1.5] so they come back
  apart), scaled so the refused come back at about REFUSALS_PER_SECOND together: the
  refused rate seen over the current advice says how many wait.

Submissions are always accepted -- a refused submission would be work lost -- and
heartbeats and registrations are answered as ever.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable

#: how often the event loop's lag is sampled
TICK = 0.05
#: how often the cap and the advice are decided
DECIDE = 0.25
#: seconds after a cut before the next (the leases it refuses end over a rollout's time)
COOLDOWN = 1.0
#: the process's CPU share (of one core) above which a late loop is its own doing
BUSY = 0.8
#: refused leases a second the advice aims at (each costs a request's parsing)
REFUSALS_PER_SECOND = 200.0
#: the longest retry_after advised
MAX_RETRY = 60.0
#: the cap never goes below this many leases in flight
MIN_CAP = 8
#: a cut keeps at least this share of the leases in flight
MAX_CUT = 0.5
#: the share a binding cap is raised by at a decision (none within COOLDOWN of a cut:
#: raised faster than its cuts show, the cap swings around the loop's capacity)
RAISE = 0.1


class Overload:
    """Watches the event loop; caps the leases in flight and advises when to return."""

    def __init__(self, lag_limit: float, base_retry: float,
                 in_flight: Callable[[], int]) -> None:
        #: seconds of lag past which the busy loop sheds (0: never)
        self.lag_limit = lag_limit
        self.base_retry = base_retry
        self.retry = base_retry
        self._in_flight = in_flight
        #: leases in flight granted at most (inf: no cap yet)
        self.cap = math.inf
        #: the mean lag over the last decision's samples (one long callback is not a queue)
        self.lag = 0.0
        #: leases refused, ever and since the last decision
        self.shed = 0
        self._refused = 0
        self._cut_at = float("-inf")
        self._rng = random.Random(0)

    @property
    def shedding(self) -> bool:
        return self._in_flight() >= self.cap

    def admit(self) -> bool:
        """May a lease be granted now? Counts a refusal when not."""
        if self._in_flight() < self.cap:
            return True
        self.shed += 1
        self._refused += 1
        return False

    def retry_after(self) -> float:
        """Seconds a node refused now should wait (spread so they come back apart)."""
        return round(self.retry * self._rng.uniform(0.5, 1.5), 3)

    def decide(self, lag: float, busy: float, seconds: float) -> None:
        """One decision from the lag seen and the CPU share used over ``seconds``."""
        in_flight = self._in_flight()
        now = time.monotonic()
        settled = now - self._cut_at >= COOLDOWN  # a cut shows only as leases end
        if self.lag_limit > 0 and lag > self.lag_limit and busy >= BUSY:
            if settled:
                self._cut_at = now
                self.cap = max(MIN_CAP, min(self.cap, in_flight)
                               * max(MAX_CUT, self.lag_limit / lag))
        elif in_flight >= self.cap - 1 and settled:
            self.cap += max(1.0, self.cap * RAISE)
        refused = self._refused / seconds
        self._refused = 0
        factor = min(2.0, max(0.5, refused / REFUSALS_PER_SECOND)) if refused else 0.9
        self.retry = min(MAX_RETRY, max(self.base_retry, self.retry * factor))

    async def watch(self) -> None:
        """Sample the loop's lag every TICK and decide every DECIDE seconds (forever)."""
        if self.lag_limit <= 0:
            return
        loop = asyncio.get_running_loop()
        decided, cpu, lags = loop.time(), time.process_time(), []
        while True:
            before = loop.time()
            await asyncio.sleep(TICK)
            now = loop.time()
            lags.append(now - before - TICK)
            if now - decided >= DECIDE:
                used = time.process_time()
                self.lag = sum(lags) / len(lags)
                self.decide(self.lag, (used - cpu) / (now - decided), now - decided)
                decided, cpu, lags = now, used, []
