"""Over-provisioned groups (``workflow.group``): a group starts extra samples and keeps
the first back; the rest are cancelled, counted, and their rewards audited in a share of
groups; the extra is derived from the sample times a node measures."""

import asyncio
import math
import random

import pytest

from astraflow.workflows.groups import (
    GroupConfig,
    GroupPlan,
    Overprovision,
    derived_extra,
    first_of,
    planned,
    sizes,
)


def _run(coro):
    return asyncio.run(coro)


async def _group(delays: list[float], plan: GroupPlan | None, rewards: list[float] | None = None
                 ) -> tuple[list[int], list[int]]:
    """Runs a group whose sample i takes delays[i] s; returns (kept, cancelled) indices."""
    cancelled: list[int] = []

    async def sample(i: int) -> int:
        try:
            await asyncio.sleep(delays[i])
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    def run() -> asyncio.Future:
        started, keep = sizes(4)
        return first_of(sample, started, keep,
                        reward=(lambda i: rewards[i]) if rewards else None)

    if plan is None:
        return await run(), cancelled
    with planned(plan):
        return await run(), cancelled


def test_a_group_keeps_its_first_samples_back_in_their_order_and_cancels_the_rest():
    delays = [0.30, 0.01, 0.20, 0.02, 0.03, 0.04]  # 4 + 2 extra: 0 and 2 are the slowest
    plan = GroupPlan(size=4, extra=2)
    kept, cancelled = _run(_group(delays, plan))
    assert kept == [1, 3, 4, 5]
    assert sorted(cancelled) == [0, 2]
    assert (plan.started, plan.cancelled) == (6, 2)
    assert plan.metadata() == {"cancelled": 2}
    assert plan.seconds == []  # cut short: its times are not a fair draw


def test_without_a_plan_or_for_another_group_size_nothing_changes():
    kept, cancelled = _run(_group([0.03, 0.01, 0.02, 0.0], None))
    assert (kept, cancelled) == ([0, 1, 2, 3], [])
    plan = GroupPlan(size=8, extra=4)  # a plan for another group (e.g. a verifier's)
    kept, cancelled = _run(_group([0.03, 0.01, 0.02, 0.0], plan))
    assert (kept, cancelled, plan.cancelled) == ([0, 1, 2, 3], [], 0)
    assert len(plan.seconds) == 4  # an uncut group's times are measured


def test_an_audited_group_waits_for_all_and_reports_both_rewards():
    delays = [0.05, 0.01, 0.04, 0.02, 0.03, 0.00]
    rewards = [0.0, 1.0, 0.0, 1.0, 0.5, 1.0]
    plan = GroupPlan(size=4, extra=2, audit=True)
    kept, cancelled = _run(_group(delays, plan, rewards))
    assert kept == [1, 3, 4, 5] and cancelled == []
    assert len(plan.seconds) == 6
    meta = plan.metadata()
    assert meta["cancelled"] == 2
    assert meta["audit_kept_reward"] == pytest.approx((1.0 + 1.0 + 0.5 + 1.0) / 4)
    assert meta["audit_cancelled_reward"] == pytest.approx(0.0)


def test_keep_trains_the_first_m_of_a_group_of_n():
    plan = GroupPlan(size=4, keep=3)
    kept, cancelled = _run(_group([0.03, 0.01, 0.20, 0.02], plan))
    assert (kept, cancelled, plan.cancelled) == ([0, 1, 3], [2], 1)


def test_a_failed_sample_fails_the_group_and_cancels_the_others():
    cancelled: list[int] = []

    async def sample(i: int) -> int:
        if i == 1:
            raise ValueError("the environment broke")
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    with pytest.raises(ValueError, match="environment broke"):
        _run(first_of(sample, 6, 4))
    assert sorted(cancelled) == [0, 2, 3, 4, 5]


def test_a_group_cancelled_from_outside_cancels_every_sample():
    """A node that leaves cancels its rollouts: none of a group's samples runs on."""
    cancelled: list[int] = []

    async def sample(i: int) -> int:
        try:
            await asyncio.sleep(5.0)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    async def main() -> None:
        group = asyncio.ensure_future(first_of(sample, 6, 4))
        await asyncio.sleep(0.01)
        group.cancel()
        with pytest.raises(asyncio.CancelledError):
            await group

    _run(main())
    assert sorted(cancelled) == [0, 1, 2, 3, 4, 5]


def test_an_audited_sample_that_fails_past_those_kept_does_not_fail_the_group():
    async def sample(i: int) -> int:
        await asyncio.sleep(0.01 * i)
        if i == 5:
            raise ValueError("the environment broke late")
        return i

    plan = GroupPlan(size=4, extra=2, audit=True)

    async def main() -> list[int]:
        with planned(plan):
            return await first_of(sample, *sizes(4))

    assert _run(main()) == [0, 1, 2, 3]
    assert len(plan.seconds) == 5  # the five that ended


def _lognormal(n: int, median: float, sigma: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [median * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]


def test_the_extra_is_derived_from_the_tail_of_the_measured_times():
    # the latency job: median 0.1 s, shape 1.0, a group turnaround of 0.6 s: the 8th of
    # 12 draws is at about 1.5x the median
    assert derived_extra(_lognormal(256, 0.1, 1.0), 8, 0.6) == 4
    # a heavier tail asks for more
    assert derived_extra(_lognormal(256, 0.1, 2.0), 8, 0.6) == 5
    # a compute-bound job: samples finish within milliseconds of each other
    assert derived_extra(_lognormal(256, 0.002, 1.0), 8, 0.1) == 0
    # a tail that is small against the group's turnaround is not worth cutting
    assert derived_extra(_lognormal(256, 0.1, 0.3), 8, 2.0) == 0
    # nothing derived before enough times and a turnaround are measured
    assert derived_extra(_lognormal(64, 0.1, 1.0), 8, 0.6) == 0
    assert derived_extra(_lognormal(256, 0.1, 1.0), 8, None) == 0


def test_a_node_plans_from_what_it_measured_and_audits_a_share_of_cut_groups():
    groups = Overprovision(GroupConfig(audit=0.25), seed=1)
    assert groups.plan(8, 0.6).extra == 0  # nothing measured yet
    groups.observe(GroupPlan(size=8, seconds=_lognormal(256, 0.1, 1.0), started=256))
    plans = [groups.plan(8, 0.6) for _ in range(400)]
    assert {p.extra for p in plans} == {4}
    assert 60 < sum(p.audit for p in plans) < 140
    assert "4 extra derived" in groups.why(0.6)
    fixed = Overprovision(GroupConfig(extra=2, audit=0.0))
    assert (fixed.plan(8, None).extra, fixed.plan(8, None).audit) == (2, False)
    assert "workflow.group.extra=2 (set)" in fixed.why(None)
