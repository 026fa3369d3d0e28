"""A trainer's weight stream: one version per step, published behind the next step.

Each step's weights are a snapshot (``export_weights``) taken when the step ends; with
``overlap_publish`` the snapshot is published and the batch acknowledged on a thread of
their own while the next step trains, one step at a time and in order, so a trainer
holds two snapshots at most (the one publishing, the one just taken).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from astraflow.trainer import in_thread
from astraflow.trainer.ranks import Leader
from astraflow.weights.publisher import WeightPublisher


def adapter_of(backend: Leader, model_path: str) -> dict[str, Any] | None:
    """What every version of a LoRA stream says of itself: its base and config."""
    config = backend.adapter_config()
    if config is None:
        return None
    from astraflow.weights.base import base_sha256

    return {"base_sha256": base_sha256(model_path), "base_name": Path(model_path).name,
            "config": config}


class StepPublisher:
    """Publishes one policy's versions, each step's behind the next step (``overlap``)
    or before it. An error behind is raised in the trainer's thread by :meth:`wait`."""

    def __init__(self, weights: WeightPublisher, overlap: bool) -> None:
        self.weights = weights
        self.overlap = overlap
        self.pending: Future[None] | None = None

    def publish(self, version: int, snapshot: dict[str, Any]) -> None:
        """Publish ``snapshot`` (from ``export_weights``) as ``version``. The snapshot is
        this publish's alone: its bits are shared, not copied, and the publisher keeps
        them as the next delta's base."""
        from astraflow.weights.safetensors_io import from_torch

        self.weights.publish(version, {name: from_torch(t, copy=False)
                                       for name, t in snapshot.items()}, owned=True)

    def after_step(self, finish: Callable[[], None]) -> None:
        """Run ``finish`` (publish, acknowledge, report) now or behind the next step."""
        if not self.overlap:
            finish()
            return
        assert self.pending is None or self.pending.done()
        self.pending = in_thread(finish, "publish-behind")

    def wait(self) -> None:
        """Until the step publishing behind is done; raises its error."""
        if self.pending is not None:
            future, self.pending = self.pending, None
            future.result()
