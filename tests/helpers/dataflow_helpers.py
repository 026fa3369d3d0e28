"""Helpers shared by the data-layer tests (put on sys.path by conftest.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
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


def start_service(argv: list[str], url_file: Path) -> tuple[subprocess.Popen, str]:
    """A data layer in a process of its own (``argv``, the token in its environment) and
    its URL, once it wrote it to ``url_file``."""
    url_file.unlink(missing_ok=True)
    proc = subprocess.Popen(argv, env={**os.environ, "ASTRAFLOW_TOKEN": TOKEN},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: url_file.exists() or proc.poll() is not None, 30, "the service's url")
    assert proc.poll() is None, proc.stderr.read().decode()
    return proc, url_file.read_text().strip()


def submit_group(client: Any, lease: Any, rewards: list[float], version: int = 0) -> Any:
    """``rewards`` as a group of the lease's task, each sample named TASK/K."""
    tid = lease.task.task_id
    trajs = group(tid, rewards, version=version)
    for k, t in enumerate(trajs):
        t.metadata["sample"] = f"{tid}/{k}"
    return client.submit(lease, trajs)
