"""Admission control as a pure function: what the data layer knows when a node asks for
tasks (a :class:`Snapshot`) in, how many tasks it may be issued and why not more (a
:class:`Grant`) out.

A new task's samples are trained on at a version ``lag + running + k`` past the
weights the node generates them with: ``lag`` versions the node is behind, ``running``
for a step in progress, and ``k`` batches before them -- those already queued
(buffered, committing, in flight on every node) and at least as many as the trainer
takes while this node rolls the task out (its measured turnaround over the trainer's
measured step interval). Only tasks whose every sample keeps that within
``max_staleness`` and fits the buffer are issued, so nothing is generated to be dropped
as stale: a node too far behind is told to refresh, one too slow for the bound is told
why. Within the bound, no more is queued than the trainer consumes while the slowest
node turns a task around, at the pace it steps when fed, plus :data:`AHEAD_BATCHES`
(Little's law on the data layer's side): samples beyond that would only wait in the
buffer, growing staler, and a bound widened for a slow environment is room for its tail,
not a queue to fill. Once what is queued covers the steps a trainer said it has left,
nothing more is issued (a run's end leaves nothing generated for nobody); once every
trainer is gone (the run is over), nothing is issued at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: no policy limits the grant (more than any node asks for)
UNLIMITED = 1 << 30
#: batches queued beyond what the trainer consumes over the slowest turnaround: the
#: margin for the turnarounds' spread (a group much slower than its median one)
AHEAD_BATCHES = 2


@dataclass(frozen=True)
class PolicyView:
    """One policy as admission control sees it when a node asks."""

    max_staleness: int
    #: samples a task yields (measured; the group size until a task completes)
    samples_per_task: float
    buffered: int = 0
    #: accepted samples whose commit is under way
    committing: int = 0
    #: versions the asking node's weights are behind
    lag: int = 0
    #: held batches whose step has not published its version yet
    running: int = 0
    #: unacknowledged batches held by the policy's trainers
    held_batches: int = 0
    #: trainer steps taken while the asking node rolls a task out
    meanwhile: float = 0.0
    #: the asking node's measured lease-to-submission seconds
    turnaround: float | None = None
    #: trainer steps taken, at its pace when fed, while the slowest node turns a task
    #: around (None until both are measured): what the queue must cover
    cover: float | None = None
    #: steps the policy's trainer said it has still to take (None until it says)
    steps_left: int | None = None
    #: every trainer of the policy is gone
    orphaned: bool = False


@dataclass(frozen=True)
class Snapshot:
    batch_size: int
    buffer_capacity: int
    end_spare_batches: int
    #: tasks leased and not yet submitted, on every node
    in_flight: int
    policies: dict[str, PolicyView]


@dataclass(frozen=True)
class Grant:
    #: tasks the node may be issued now
    tasks: int
    #: per policy that limits it to none: one line saying why
    reasons: dict[str, str] = field(default_factory=dict)
    #: per such policy, the kind of refusal (counted in /v1/status)
    kinds: dict[str, str] = field(default_factory=dict)


def admit(snap: Snapshot) -> Grant:
    """How many more tasks the asking node may be issued now, and why not more (see the
    module's docstring)."""
    live = {p: v for p, v in snap.policies.items() if not v.orphaned}
    if snap.policies and not live:
        # the run is over (or every trainer died): whatever is generated now could only
        # be dropped; a returning trainer reopens admission
        why = "every trainer is gone: nothing would train on new samples"
        return Grant(0, dict.fromkeys(snap.policies, why),
                     dict.fromkeys(snap.policies, "trainer_gone"))
    allowed, reasons, kinds = UNLIMITED, {}, {}
    for policy, view in live.items():
        if view.samples_per_task <= 0:
            continue
        n, refusal = _room(snap, view)
        if n == 0 and refusal is not None:
            kinds[policy], reasons[policy] = refusal
        allowed = min(allowed, n)
    return Grant(allowed, reasons, kinds)


def _room(snap: Snapshot, v: PolicyView) -> tuple[int, tuple[str, str] | None]:
    """Tasks one policy allows, and when none, its refusal (kind, line)."""
    per_task = v.samples_per_task
    queued = v.buffered + v.committing + snap.in_flight * per_task
    budget = v.max_staleness - v.lag - v.running  # batches a new sample may wait
    room_stale = (budget + 1) * snap.batch_size - queued
    room_cap = snap.buffer_capacity - queued
    n = min(int(max(0.0, room_stale) // per_task), int(max(0.0, room_cap) // per_task))
    if (n == 0 and v.running == 0 and v.lag <= v.max_staleness
            and 0 < snap.batch_size - queued <= room_cap):
        # the trainer's next batch cannot fill from what is queued: it gets the tasks
        # that fill it even if the last one overshoots by part of a task (with
        # max_staleness=0 or a node behind, the batch would wait forever)
        n = math.ceil((snap.batch_size - queued) / per_task)
    elif budget < 0 or int(v.meanwhile) > budget:
        n = 0
    # what is queued feeds the trainer until what is issued now would land
    cover = None if v.cover is None else math.ceil(v.cover)
    enough = False
    if n > 0 and cover is not None:
        room_need = (cover + AHEAD_BATCHES) * snap.batch_size - queued
        enough = room_need < per_task
        n = min(n, int(max(0.0, room_need) // per_task))
    needed = _still_needed(snap, v)
    if needed is not None:  # the run's end: nothing beyond its last batch
        n = min(n, max(0, math.ceil((needed - queued) / per_task)))
    if n > 0:
        return n, None
    if needed is not None and needed <= queued:
        return 0, ("run_covered", (
            f"enough for the run: the trainer's last {v.steps_left} steps are covered by "
            f"the {queued:.0f} samples queued and the batches it holds"))
    if enough:
        return 0, ("enough_queued", (
            f"enough queued: {queued:.0f} samples cover the {cover} trainer "
            f"steps of the slowest turnaround and {AHEAD_BATCHES} batches more"))
    return 0, _refusal(snap, v, queued, full=room_cap < room_stale)


def _still_needed(snap: Snapshot, v: PolicyView) -> int | None:
    """Samples the policy's trainer has yet to be served for the steps it said it has
    left (None until it says), with ``end_spare_batches`` more while it needs any: a
    run's end generates nothing past its last batches, which take the first groups
    back, not the slowest."""
    if v.steps_left is None:
        return None
    steps = max(0, v.steps_left - v.held_batches)
    spare = snap.end_spare_batches if steps else 0
    return (steps + spare) * snap.batch_size


def _refusal(snap: Snapshot, v: PolicyView, queued: float, full: bool) -> tuple[str, str]:
    """Why admission control issues no task for a policy: a kind, and one line."""
    m, lag, running = v.max_staleness, v.lag, v.running
    if full:
        return "buffer_full", (
            f"buffer full ({v.buffered} buffered + {snap.in_flight} tasks in flight, "
            f"capacity {snap.buffer_capacity})")
    if lag + running > m:
        return "refresh_first", (
            f"refresh first: the node's weights are {lag} versions behind; its samples "
            f"would be trained on more than max_staleness={m} versions later")
    if int(v.meanwhile) > m - lag - running:
        return "turnaround", (
            f"turnaround {v.turnaround or 0.0:.2f}s: the trainer takes {v.meanwhile:.1f} "
            f"steps while this node rolls a task out, more than max_staleness={m} allows "
            f"({lag} behind, {running} step running)")
    return "staleness", (
        f"staleness: {queued:.0f} samples queued would be consumed more than "
        f"max_staleness={m} versions after the node's weights ({lag} behind, {running} "
        "step running)")
