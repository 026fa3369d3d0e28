"""What the :class:`~astraflow.contracts.Workflow` contract promises of scoring: a
reward is user code that may raise, hang or return something that is not a number, and
:meth:`Workflow.score <astraflow.contracts.Workflow.score>` turns each of those into a
*failed* :class:`Score` -- counted, its first reason kept, and kept out of its group's
advantage statistics by the data layer -- instead of a failed rollout or a dead node.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from astraflow.deprecation import deprecated
from astraflow.types import LEGACY_FAILED, LEGACY_METRICS, LEGACY_REASON, RewardOutcome, Task

#: longest traceback carried with a failed sample
ERROR_CHARS = 4000


@dataclass
class Score:
    """One sample's reward: ``value`` plus the extra metrics a reward returned."""

    value: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def outcome(self) -> RewardOutcome:
        """What a trajectory carries about its reward (``Trajectory.outcome``)."""
        return RewardOutcome(failed=self.failed, reason=self.error, metrics=dict(self.metrics))

    @deprecated(since="1.2", removed_in="2.0",
                instead="pass score.outcome as the trajectory's outcome "
                        "(TrajectoryBuilder.build(..., outcome=score.outcome))")
    def metadata(self) -> dict[str, Any]:
        """The outcome as the metadata keys read before ``Trajectory.outcome``."""
        out: dict[str, Any] = {LEGACY_METRICS: dict(self.metrics)} if self.metrics else {}
        if self.error is not None:
            out.update({LEGACY_FAILED: True, LEGACY_REASON: self.error})
        return out


def as_score(result: Any) -> Score:
    """A reward's return value as a :class:`Score`; ValueError or TypeError if it is
    neither a finite number nor a dict with a ``"score"``."""
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
                error = "".join(traceback.format_exception(exc))[-ERROR_CHARS:]
            return Score(0.0, error=error)

    async def _call(self, task: Task, completion: str) -> Any:
        call = self.reward
        if inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
                getattr(call, "__call__", None)):  # noqa: B004 -- an async __call__
            return await call(task, completion)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._pool, call, task, completion)
        return await result if inspect.isawaitable(result) else result
