"""What every reward option shares, and how a node scores samples without ever dying.

A reward is user code: it may raise, hang, or return something that is not a number.
:class:`RewardRunner` turns each of those into a *failed* sample -- counted, its first
traceback kept, and kept out of its group's advantage statistics by the data layer --
instead of a failed rollout or a dead node.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from astraflow.schema import setting
from astraflow.types import Task

#: trajectory metadata keys the data layer and the trainer read
FAILED = "reward_failed"
ERROR = "reward_error"
METRICS = "reward_metrics"
#: longest traceback carried with a failed sample
_ERROR_CHARS = 4000


@dataclass
class RewardConfig:
    """Settings every reward option shares."""

    name: str = "exact_match"
    #: seconds per sample; slower scores the sample as failed
    timeout: float = setting(10.0, gt=0)
    #: the run stops once more of the samples produced than this failed their reward
    #: (1: never)
    max_failure_fraction: float = setting(0.25, ge=0, le=1)


@dataclass
class Score:
    """One sample's reward: ``value`` plus the extra metrics a reward returned."""

    value: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def metadata(self) -> dict[str, Any]:
        """What a trajectory carries about its reward."""
        out: dict[str, Any] = {METRICS: dict(self.metrics)} if self.metrics else {}
        if self.error is not None:
            out.update({FAILED: True, ERROR: self.error})
        return out


def reward_metric_means(metadata: list[dict[str, Any]]) -> dict[str, float]:
    """``reward/<name>``: the batch mean of each extra metric the reward returned."""
    sums: dict[str, list[float]] = {}
    for meta in metadata:
        for key, value in (meta.get(METRICS) or {}).items():
            sums.setdefault(f"reward/{key}", []).append(float(value))
    return {key: sum(values) / len(values) for key, values in sorted(sums.items())}


def as_score(result: Any) -> Score:
    metrics: dict[str, float] = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a reward returned a dict without a 'score' key: {sorted(result)}")
        metrics = {str(k): float(v) for k, v in result.items() if k != "score"}
        result = result["score"]
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise TypeError(f"a reward returned {type(result).__name__}, expected a number "
                        "or a dict with a 'score'")
    value = float(result)
    if not math.isfinite(value):
        raise ValueError(f"a reward returned {value}")
    return Score(value, metrics)


class RewardRunner:
    """Calls a reward with a timeout; sync rewards run on a small pool of threads.

    A hung synchronous reward cannot be killed from Python: its thread stays busy
    until the function returns, the sample is already scored as failed, and the pool
    keeps serving the others with its remaining threads.
    """

    def __init__(self, reward: Any, timeout: float, threads: int = 8) -> None:
        self.reward = reward
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reward")

    async def score(self, task: Task, completion: str) -> Score:
        try:
            if getattr(self.reward, "inline", False):
                return as_score(self.reward(task, completion))
            result = await asyncio.wait_for(self._call(task, completion), self.timeout)
            return as_score(result)
        except Exception as exc:  # user code: anything it raises fails the sample only
            if isinstance(exc, TimeoutError):
                error = f"TimeoutError: the reward took longer than reward.timeout={self.timeout}s"
            else:
                error = "".join(traceback.format_exception(exc))[-_ERROR_CHARS:]
            return Score(0.0, error=error)

    async def _call(self, task: Task, completion: str) -> Any:
        call = self.reward
        if inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
                getattr(call, "__call__", None)):  # noqa: B004 -- an async __call__
            return await call(task, completion)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._pool, call, task, completion)
        return await result if inspect.isawaitable(result) else result
