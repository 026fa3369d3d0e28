"""A reward is user code: whatever it does, the sample is scored and the node goes on."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from astraflow.rewards.base import FAILED, METRICS, RewardRunner, Score, reward_metric_means
from astraflow.rl.advantages import group_advantages
from astraflow.types import RewardOutcome, Span, Task, Trajectory

TASK = Task("t", "2+2=", "4")


def score(reward, timeout: float = 2.0):
    return asyncio.run(RewardRunner(reward, timeout=timeout).score(TASK, "4"))


def test_a_float_a_dict_and_an_async_reward_all_score():
    assert score(lambda task, completion: 1.0).value == 1.0
    result = score(lambda task, completion: {"score": 0.5, "length": 3})
    assert (result.value, result.metrics, result.failed) == (0.5, {"length": 3.0}, False)

    async def judged(task, completion):
        await asyncio.sleep(0)
        return float(completion == task.answer)

    assert score(judged).value == 1.0


def test_a_raising_reward_fails_the_sample_with_its_traceback():
    def broken(task, completion):
        raise KeyError("ground_truth")

    result = score(broken)
    assert result.failed and result.value == 0.0
    assert "KeyError: 'ground_truth'" in result.error and "broken" in result.error
    assert result.outcome.failed and result.outcome.reason == result.error


@pytest.mark.parametrize("bad", [None, "1.0", float("nan"), {"value": 1.0}, True])
def test_a_reward_returning_no_number_fails_the_sample(bad):
    result = score(lambda task, completion: bad)
    assert result.failed and result.value == 0.0


def test_a_hung_reward_times_out_and_the_others_are_still_scored():
    release = threading.Event()

    def slow(task, completion):
        if completion == "hang":
            release.wait(10)
        return 1.0

    async def both():
        runner = RewardRunner(slow, timeout=0.3)
        return await asyncio.gather(runner.score(TASK, "hang"), runner.score(TASK, "4"))

    started = time.monotonic()
    hung, fine = asyncio.run(both())
    release.set()
    assert time.monotonic() - started < 5
    assert hung.failed and "reward.timeout=0.3" in hung.error
    assert not fine.failed and fine.value == 1.0


def test_failed_samples_are_kept_out_of_the_group_statistics():
    rewards = [1.0, 0.0, 0.0, 0.0]
    # the failed sample (scored 0.0) neither lowers the mean nor earns an advantage
    with_failure = group_advantages(rewards, failed=[False, False, True, True])
    assert with_failure[2:] == [0.0, 0.0]
    assert with_failure[:2] == pytest.approx(group_advantages([1.0, 0.0]))
    assert group_advantages(rewards, failed=[True] * 4) == [0.0] * 4
    assert group_advantages(rewards) == group_advantages(rewards, failed=[False] * 4)


def test_extra_metrics_are_averaged_per_batch():
    outcomes = [RewardOutcome(metrics={"len": 2.0}),
                RewardOutcome(metrics={"len": 4.0, "found": 1.0}), RewardOutcome()]
    assert reward_metric_means(outcomes) == {"reward/found": 1.0, "reward/len": 3.0}


def test_a_score_told_in_the_metadata_as_before_1_2_still_counts_and_warns():
    """A workflow written for 1.1 puts ``score.metadata()`` in the trajectory's metadata:
    it is deprecated (it warns, naming what to use) and read into the typed outcome."""
    failed = Score(0.0, error="Traceback ...\nKeyError: 'x'")
    with pytest.warns(FutureWarning, match="score.outcome"):
        meta = failed.metadata()
    assert meta == {FAILED: True, "reward_error": failed.error}
    traj = Trajectory("t", "g", "policy", [1], [0.0], [1], [0], [Span(0, 1, "policy", 0)],
                      0.0, {**meta, "task_type": "x"})
    assert traj.outcome == RewardOutcome(failed=True, reason=failed.error)
    with pytest.warns(FutureWarning):
        scored = Score(1.0, {"len": 2.0}).metadata()
    assert Trajectory("t", "g", "policy", [1], [0.0], [1], [0], [Span(0, 1, "policy", 0)],
                      1.0, scored).outcome == RewardOutcome(metrics={"len": 2.0})
    assert METRICS in scored


def test_an_inline_reward_runs_on_the_event_loop_and_its_errors_still_fail_the_sample():
    from astraflow.rewards.exact_match import ExactMatch

    assert ExactMatch.inline
    threads = []

    class Inline:
        inline = True

        def __call__(self, task, completion):
            threads.append(threading.current_thread())
            if completion == "boom":
                raise ValueError("no answer")
            return float(completion == task.answer)

    runner = RewardRunner(Inline(), timeout=2.0)
    assert asyncio.run(runner.score(TASK, "4")).value == 1.0
    failed = asyncio.run(runner.score(TASK, "boom"))
    assert failed.failed and "ValueError: no answer" in failed.error
    assert threads == [threading.main_thread()] * 2
    # one that is not inline runs on the runner's threads
    threads.clear()
    Inline.inline = False
    assert asyncio.run(runner.score(TASK, "4")).value == 1.0
    assert threads[0] is not threading.main_thread()
