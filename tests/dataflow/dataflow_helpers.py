"""Helpers shared by the data-layer tests (put on sys.path by conftest.py)."""

from __future__ import annotations

from typing import Any

from astraflow.testing import wait_until
from astraflow.types import PROMPT, Span, Trajectory

TOKEN = "test-token"
__all__ = ["TOKEN", "wait_until"]


def make_trajectory(task_id: str, policy: str = "policy", reward: float = 0.0,
                    version: int = 0, group_id: str = "g", prompt_len: int = 3,
                    gen_len: int = 5, context: str | None = None) -> Trajectory:
    """A prompt, optionally another policy's tokens (context), then this policy's tokens."""
    spans = [Span(0, prompt_len, PROMPT)]
    pos = prompt_len
    if context is not None:
        spans.append(Span(pos, pos + 4, context, version))
        pos += 4
    spans.append(Span(pos, pos + gen_len, policy, version))
    n = pos + gen_len
    return Trajectory(
        task_id=task_id,
        group_id=group_id,
        policy=policy,
        tokens=list(range(1, n + 1)),
        logprobs=[0.0] * pos + [-0.5] * gen_len,
        loss_mask=[0] * pos + [1] * gen_len,
        versions=[-1] * prompt_len + [version] * (n - prompt_len),
        spans=spans,
        reward=reward,
    )


def group(task_id: str, rewards: list[float], **kw: Any) -> list[Trajectory]:
    return [make_trajectory(task_id, reward=r, **kw) for r in rewards]
