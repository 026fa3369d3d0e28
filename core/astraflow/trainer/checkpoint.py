"""A trainer's checkpoints and its journal: where it resumes after a kill.

Before it acknowledges a batch the trainer either checkpoints (every
``checkpoint_interval`` seconds, stretched so that writing takes at most a tenth of its
time) or appends the batch to its journal (:mod:`astraflow.trainer.journal`). A
restarted trainer loads the checkpoint and trains the journal's batches again, which
brings it back to the state it was killed in: nothing acknowledged is lost, nothing is
trained twice.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from astraflow.trainer.journal import BatchJournal
from astraflow.trainer.ranks import Leader
from astraflow.types import Batch

log = logging.getLogger("astraflow.trainer")


@dataclass
class Progress:
    """Where a trainer is: steps trained, the version they made, and the batch its
    checkpoint already holds (killed before acknowledging it, the trainer is served it
    again and must acknowledge it, not train on it twice)."""

    step: int = 0
    version: int = 0
    trained_batch: str | None = None


class Checkpointer:
    """Writes one policy's checkpoints and journal under ``<work_dir>/checkpoints``."""

    def __init__(self, work_dir: Path, policy: str, interval: float) -> None:
        self.policy = policy
        self.dir = work_dir / "checkpoints" / policy
        self.journal = BatchJournal(work_dir / "checkpoints" / f"{policy}.journal")
        self.interval = interval
        #: when the last checkpoint was written (monotonic), and how long it took
        self.saved_at = time.monotonic()
        self.save_seconds = 0.0

    def _sibling(self, suffix: str) -> Path:
        return self.dir.with_name(self.dir.name + suffix)

    def due(self) -> bool:
        """Whether the next step checkpoints rather than journals: ``interval`` seconds
        passed, stretched to nine times the last save (a 0.5B model's fp32 weights and
        AdamW moments are 6 GB: ~20 s to write here)."""
        interval = max(self.interval, 9 * self.save_seconds) if self.interval > 0 else 0.0
        return time.monotonic() - self.saved_at >= interval

    def record(self, backend: Leader, progress: Progress, batch: Batch, last: bool) -> None:
        """Keep the step ``batch`` was just trained at, before it is acknowledged."""
        if last or self.due():
            self.save(backend, progress, batch.batch_id)
        else:
            self.journal.append(progress.step, progress.version, batch)

    def save(self, backend: Leader, progress: Progress, batch_id: str) -> None:
        started = time.monotonic()
        tmp, old = self._sibling(".tmp"), self._sibling(".old")
        _rmtree(tmp)  # what a killed save left: shards of another world size must not mix in
        backend.save_checkpoint(str(tmp))
        (tmp / "runtime.json").write_text(json.dumps({
            "version": progress.version, "step": progress.step, "batch_id": batch_id}))
        if self.dir.exists():
            # only a complete checkpoint is ever renamed into place, so with one there a
            # leftover .old (a save killed between its renames or while removing it) is
            # stale; a rename onto a non-empty folder would fail
            _rmtree(old)
            os.replace(self.dir, old)
        os.replace(tmp, self.dir)
        self.journal.clear()  # killed before this, the replay skips what the checkpoint holds
        _rmtree(old)
        self.save_seconds = time.monotonic() - started
        self.saved_at = time.monotonic()

    def resume(self, backend: Leader, progress: Progress) -> bool:
        """Bring ``backend`` and ``progress`` back to where a killed trainer was; whether
        there was anything to resume (a checkpoint or a journal)."""
        for candidate in (self.dir, self._sibling(".old")):
            meta = candidate / "runtime.json"
            if meta.exists():
                backend.load_checkpoint(str(candidate))
                state = json.loads(meta.read_text())
                progress.version, progress.step = state["version"], state["step"]
                progress.trained_batch = state.get("batch_id")
                self._replay(backend, progress)
                return True
        # before its first checkpoint a trainer holds model.path and fresh moments, which
        # building it made again
        return self._replay(backend, progress)

    def _replay(self, backend: Leader, progress: Progress) -> bool:
        """Train the journal's batches again; their versions were published already."""
        entries = [entry for entry in self.journal.recover() if entry[0] > progress.step]
        if not entries:
            return False
        t0 = time.time()
        for step, version, batch in entries:
            if step != progress.step + 1:
                raise RuntimeError(f"{self.journal.path}: step {step} follows step "
                                   f"{progress.step}; a record is missing")
            backend.train_step(batch)
            progress.step, progress.version = step, version
            progress.trained_batch = batch.batch_id
        log.info("trainer %s: trained the %d batches journalled since the checkpoint again "
                 "(%.1f s), now at step %d", self.policy, len(entries), time.time() - t0,
                 progress.step)
        return True


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
