"""Over-provisioned groups: start more samples than a group trains, keep the first back.

A group waits for its slowest sample. When samples wait on an environment with a long
tail (a sandbox, a tool, a verifier service), the slowest of 8 log-normal calls of median
0.1 s and shape 1.0 averages 0.51 s, five times one call's median, and every sample the
group trains is that much older when it arrives. Started as 8 + 4 and complete at its
first 8, the same group waits 0.15 s on average (APRIL; slime's over-sampling; prime-rl's
oversampling factor). The samples still running then are cancelled: their engine
requests are aborted and their environment calls abandoned; they are counted, never
trained, and never charged as stale.

How many extra samples a group starts (``workflow.group.extra``) is derived, unless set,
from the per-sample times a node measures (:class:`Overprovision`): none while a group's
slowest sample is within :data:`WORTH_CUTTING` of its turnaround (or :data:`MIN_TAIL`)
of the median one, or the median sample takes under :data:`SAMPLE_SHARE` of it (a
compute-bound job gains nothing), else the fewest, up to the group
size, that bring a group's expected wait within :data:`TARGET` x the median sample's.

Cutting the tail biases training when how long a sample takes depends on what the model
wrote (a long program runs longer; a wrong answer fails fast): the fast samples are then
not a fair draw of the policy's. A fraction of groups (``workflow.group.audit``) waits
for every sample: their cancelled-to-be samples' rewards against the kept ones' are the
gauge of that bias (the trainer logs both per step), and their times, uncut, are what the
derivation reads.

A workflow takes part by starting its group with :func:`first_of`; the node sets each
group's plan (:func:`planned`) around ``Workflow.run``. A workflow that does not use it
runs its groups as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from astraflow.schema import setting

T = TypeVar("T")

#: a group's expected wait may be this multiple of the median sample's time
TARGET = 1.5
#: over-provision only when the slowest of a group's samples takes this share of the
#: group's turnaround beyond the median sample, and at least :data:`MIN_TAIL` seconds:
#: below it there is little to cut (a compute-bound job's samples differ by the event
#: loop's and the CPU's scheduling, which extra samples would only add to)
WORTH_CUTTING = 0.25
MIN_TAIL = 0.02
#: ... and only when a sample's median time is this share of the group's turnaround: the
#: samples' own stage (the environment, the agent) is then what a group waits on
SAMPLE_SHARE = 0.1
#: uncut sample times a node keeps, and how many it needs before it derives anything
KEPT_TIMES = 256
MIN_TIMES = 128


@dataclass
class GroupConfig:
    """``workflow.group``: ``extra`` samples started beyond a group's size, whose first
    ``group_size`` to finish are trained (None: derived from the measured sample times;
    0: none); ``keep`` > 0 trains a group's first ``keep`` samples of those started
    (0: the group size); ``audit``, the fraction of over-provisioned groups that wait
    for every sample, to measure what cutting the tail costs."""

    extra: int | None = setting(None, ge=0, why="None: derived from the sample times")
    keep: int = setting(0, ge=0, why="0: the group size")
    audit: float = setting(0.0625, ge=0, le=1)


@dataclass
class GroupPlan:
    """What the node asks of one group, and what the workflow reports back."""

    size: int
    extra: int = 0
    keep: int = 0
    audit: bool = False
    #: filled in by :func:`first_of`
    started: int = 0
    cancelled: int = 0
    #: each uncut sample's seconds from the group's start (all of an audited group's,
    #: or all of one that started no extra)
    seconds: list[float] = field(default_factory=list)
    kept_rewards: list[float] = field(default_factory=list)
    cancelled_rewards: list[float] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        """What the group's trajectories carry of it (their ``metadata``): the samples
        cancelled, and for an audited group the kept and the would-be-cancelled
        samples' mean rewards."""
        out: dict[str, Any] = {}
        if self.cancelled or self.started > self.size:
            out["cancelled"] = self.cancelled
        if self.audit and self.cancelled_rewards and self.kept_rewards:
            out["audit_kept_reward"] = sum(self.kept_rewards) / len(self.kept_rewards)
            out["audit_cancelled_reward"] = (sum(self.cancelled_rewards)
                                             / len(self.cancelled_rewards))
        return out


_PLAN: contextvars.ContextVar[GroupPlan | None] = contextvars.ContextVar(
    "astraflow_group_plan", default=None)


def current() -> GroupPlan | None:
    """The plan of the group being run in this context (None outside a node's rollout)."""
    return _PLAN.get()


class planned:
    """``with planned(plan): await workflow.run(...)``: the plan :func:`first_of` reads."""

    def __init__(self, plan: GroupPlan) -> None:
        self.plan = plan
        self._token: contextvars.Token | None = None

    def __enter__(self) -> GroupPlan:
        self._token = _PLAN.set(self.plan)
        return self.plan

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _PLAN.reset(self._token)


def sizes(group_size: int) -> tuple[int, int]:
    """(samples to start, samples to keep) for a group of ``group_size`` under the plan
    in this context; ``(group_size, group_size)`` without one."""
    plan = _PLAN.get()
    if plan is None or plan.size != group_size:
        return group_size, group_size
    keep = min(plan.keep, group_size) if plan.keep > 0 else group_size
    return group_size + plan.extra, keep


async def first_of(sample: Callable[[int], Awaitable[T]], started: int, keep: int,
                   reward: Callable[[T], float] | None = None) -> list[T]:
    """Run ``sample(0) .. sample(started - 1)`` concurrently and return the first ``keep``
    to finish, in index order; the rest are cancelled. A sample that raises fails the
    group (the others are cancelled) as ``asyncio.gather`` would. ``reward`` reads a
    finished sample's reward, for an audited group's bias gauge."""
    plan = _PLAN.get()
    audit = plan is not None and plan.audit and started > keep
    begun = time.monotonic()

    async def timed(i: int) -> tuple[int, float, T]:
        value = await sample(i)
        return i, time.monotonic() - begun, value

    tasks = [asyncio.ensure_future(timed(i)) for i in range(started)]
    finished: list[tuple[int, float, T]] = []
    # counted as each sample ends (not asyncio.wait in a loop, which re-registers a
    # callback on every sample still running each time one ends)
    enough: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    need, left = (started if audit else keep), started

    def ended(task: asyncio.Task[tuple[int, float, T]]) -> None:
        nonlocal left
        left -= 1
        if enough.done():
            return
        if task.cancelled():  # by someone else: the group is cancelled with it
            enough.cancel()
        elif (error := task.exception()) is None:
            finished.append(task.result())
            if len(finished) >= need or not left:
                enough.set_result(None)
        elif len(finished) < keep:
            enough.set_exception(error)  # a failed sample fails the group
        elif not left:  # an audited group's sample past those kept: not its failure
            enough.set_result(None)

    for task in tasks:
        task.add_done_callback(ended)
    if need <= 0 or not tasks:  # nothing to wait for
        enough.set_result(None)
    try:
        await enough
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    finished.sort(key=lambda f: f[1])
    kept, late = finished[:keep], finished[keep:]
    if plan is not None:
        plan.started += started
        plan.cancelled += started - keep
        if audit or started == keep:
            plan.seconds += [seconds for _, seconds, _ in finished]
        if audit and reward is not None:
            plan.kept_rewards += [reward(value) for _, _, value in kept]
            plan.cancelled_rewards += [reward(value) for _, _, value in late]
    return [value for _, _, value in sorted(kept, key=lambda f: f[0])]


def expected_wait(times: list[float], keep: int, started: int) -> float:
    """The expected time of the ``keep``-th fastest of ``started`` draws from the
    measured ``times`` (sorted), by the order statistic's mean quantile
    ``keep / (started + 1)``."""
    q = keep / (started + 1)
    position = min(len(times) - 1, max(0, math.ceil(q * len(times)) - 1))
    return times[position]


def derived_extra(times: list[float], group_size: int, turnaround: float | None) -> int:
    """The extra samples a group of ``group_size`` starts (see the module): 0 until
    :data:`MIN_TIMES` sample times and a group ``turnaround`` are measured, or when the
    tail is not worth cutting."""
    if len(times) < MIN_TIMES or group_size < 1 or not turnaround:
        return 0
    ordered = sorted(times)
    median = ordered[len(ordered) // 2]
    tail = expected_wait(ordered, group_size, group_size) - median
    if tail < max(MIN_TAIL, WORTH_CUTTING * turnaround) or median < SAMPLE_SHARE * turnaround:
        return 0
    for extra in range(1, group_size + 1):
        if expected_wait(ordered, group_size, group_size + extra) <= TARGET * median:
            return extra
    return group_size


class Overprovision:
    """A node's plans for its groups under ``config`` (``workflow.group``), from the
    sample times it measures."""

    def __init__(self, config: GroupConfig, seed: int | None = None) -> None:
        self.extra = None if config.extra is None else int(config.extra)
        self.keep, self.audit = int(config.keep), float(config.audit)
        self.times: deque[float] = deque(maxlen=KEPT_TIMES)
        self.rng = random.Random(seed)
        #: run so far: samples started, cancelled, and the latest derived extra
        self.started = self.cancelled = 0
        self.derived = 0

    def plan(self, group_size: int, turnaround: float | None) -> GroupPlan:
        if self.extra is not None:
            extra = self.extra
        elif self.keep > 0:  # a group that keeps its first m of n starts n
            extra = 0
        else:
            extra = self.derived = derived_extra(list(self.times), group_size, turnaround)
        cut = extra > 0 or 0 < self.keep < group_size
        return GroupPlan(size=group_size, extra=extra, keep=self.keep,
                         audit=cut and self.rng.random() < self.audit)

    def observe(self, plan: GroupPlan) -> None:
        self.times.extend(plan.seconds)
        self.started += plan.started
        self.cancelled += plan.cancelled

    def why(self, turnaround: float | None) -> str:
        """One line: the extra samples a group starts now, and why."""
        if self.extra is not None:
            return f"workflow.group.extra={self.extra} (set)"
        if len(self.times) < MIN_TIMES:
            return f"none derived: {len(self.times)} of {MIN_TIMES} sample times measured"
        ordered = sorted(self.times)
        median = ordered[len(ordered) // 2]
        return (f"{self.derived} extra derived: a sample's median {median:.3f} s, the group "
                f"turnaround {turnaround or 0.0:.3f} s")

