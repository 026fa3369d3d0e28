"""The autoscale report: a dead-band target size per rollout pool.

Over one report window, f = min(sum trainer wait / sum step time, 0.95) and G is the
pool's current size. Trainers starving (f > 0.10) grow the pool to ceil(G / (1 - f));
trainers never waiting (f < 0.05) shrink it towards what they consume,
min(G, ceil(G * consumed / produced * 1.10)); in between the pool holds, so the
target does not oscillate around the balance point.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GROW_ABOVE = 0.10
SHRINK_BELOW = 0.05
MAX_WAIT_FRACTION = 0.95
HEADROOM = 1.10


def dead_band_target(size: int, wait_fraction: float, consumed: float, produced: float) -> int:
    """Target size of a pool of ``size`` nodes for one window's measurements."""
    f = min(wait_fraction, MAX_WAIT_FRACTION)
    if f > GROW_ABOVE:
        return math.ceil(size / (1.0 - f))
    if f < SHRINK_BELOW and produced > 0:
        return min(size, math.ceil(size * consumed / produced * HEADROOM))
    return size


#: production is counted in buckets of this many seconds (one entry per pool and
#: bucket, not one per submission: a busy data layer accepts thousands a second)
BUCKET_SECONDS = 1.0


@dataclass
class AutoscaleWindow:
    """Trailing-window accounting of trainer steps, consumption and per-pool production.

    Entries older than the window are let go as new ones arrive, whether or not anyone
    asks for the report: the window's memory is bounded by its length, not by the run's.
    """

    seconds: float
    steps: deque[tuple[float, float, float]] = field(default_factory=deque)  # (t, wait, step)
    consumed: deque[tuple[float, int]] = field(default_factory=deque)  # (t, n)
    produced: deque[list[Any]] = field(default_factory=deque)  # [bucket start, pool, n]
    clock: Callable[[], float] = time.time

    def step(self, wait: float, step: float, consumed: int) -> None:
        now = self.clock()
        self.steps.append((now, wait, step))
        self.consumed.append((now, consumed))
        self._trim(now)

    def produce(self, pool: str, n: int) -> None:
        now = self.clock()
        bucket = now - now % BUCKET_SECONDS
        for entry in reversed(self.produced):  # this bucket's entries are the newest
            if entry[0] != bucket:
                break
            if entry[1] == pool:
                entry[2] += n
                return
        self.produced.append([bucket, pool, n])
        self._trim(now)

    def _trim(self, now: float | None = None) -> None:
        horizon = (self.clock() if now is None else now) - self.seconds
        for events in (self.steps, self.consumed, self.produced):
            while events and events[0][0] < horizon:
                events.popleft()

    def report(self, pool_sizes: dict[str, int]) -> dict[str, Any]:
        """Per pool: size, production, the target and whether to grow, shrink or hold."""
        self._trim()
        wait = sum(e[1] for e in self.steps)
        step = sum(e[2] for e in self.steps)
        consumed = sum(e[1] for e in self.consumed)
        produced_by: dict[str, int] = {}
        for _, pool, n in self.produced:
            produced_by[pool] = produced_by.get(pool, 0) + n
        produced = sum(produced_by.values())
        fraction = min(wait / step, MAX_WAIT_FRACTION) if step > 0 else None
        pools = {}
        for pool in sorted(set(pool_sizes) | set(produced_by)):
            size = pool_sizes.get(pool, 0)
            if fraction is None:
                target, reason = size, "no trainer steps reported in the window"
            else:
                target = dead_band_target(size, fraction, consumed, produced)
                reason = (
                    f"wait fraction {fraction:.3f} > {GROW_ABOVE}" if fraction > GROW_ABOVE
                    else f"wait fraction {fraction:.3f} < {SHRINK_BELOW}"
                    if fraction < SHRINK_BELOW else "inside the dead band"
                )
            action = "grow" if target > size else "shrink" if target < size else "hold"
            pools[pool] = {
                "size": size,
                "produced": produced_by.get(pool, 0),
                "target": target,
                "action": action,
                "reason": reason,
            }
        return {
            "window_seconds": self.seconds,
            "trainer_steps": len(self.steps),
            "wait_seconds": wait,
            "step_seconds": step,
            "wait_fraction": fraction,
            "consumed": consumed,
            "produced": produced,
            "pools": pools,
        }
