"""The trainer's collaborators, each alone: its typed settings (the run config's own
defaults and ranges), the checkpointer's rule (checkpoint or journal, and resume from
both), and the report of a step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import compose_config
from astraflow.contracts.trainer import TrainerBackend
from astraflow.errors import ConfigError
from astraflow.schema import AstraFlowConfig
from astraflow.trainer.checkpoint import Checkpointer, Progress
from astraflow.trainer.ranks import Leader
from astraflow.trainer.settings import TrainerSettings, settings_from_config
from astraflow.types import Batch, Generation, TrainItem
from astraflow.workflows.builder import TrajectoryBuilder


def test_the_settings_are_the_run_config_s_with_the_policy_s_overrides(tmp_path):
    cfg = compose_config(["steps=7", "batch_size=16", "group_size=4", "fetch_ahead=false",
                          f"model.path={tmp_path}", "checkpoint_interval=5",
                          "policies.policy.lr=0.01"])
    settings = settings_from_config(cfg, "policy")
    assert (settings.steps, settings.batch_size, settings.fetch_ahead,
            settings.checkpoint_interval) == (7, 16, False, 5.0)
    assert settings.backend == cfg.trainer.name and settings.model_path == str(tmp_path)
    assert settings.backend_config.lr == 0.01  # the policy's rate, not trainer.lr
    assert settings.trainer_id == "trainer-policy"


def test_a_setting_not_given_has_the_run_config_s_default():
    settings = TrainerSettings(policy="p", backend="hf", backend_config={}, model_path="m")
    run = AstraFlowConfig()
    for name in ("steps", "batch_size", "checkpoint_interval", "fetch_ahead",
                 "overlap_publish", "record_batches"):
        assert getattr(settings, name) == getattr(run, name), name


def test_a_setting_out_of_its_range_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"trainer\.checkpoint_interval.*>= 0"):
        TrainerSettings(policy="p", backend="hf", backend_config={}, model_path="m",
                        checkpoint_interval=-1.0)
    fields = {f.name for f in dataclasses.fields(TrainerSettings)}
    assert {"world_size", "collective_timeout"} <= fields


class _Counting(TrainerBackend):
    """A backend whose whole state is the batch ids it trained on, in order."""

    def __init__(self) -> None:
        super().__init__({}, "")
        self.trained: list[str] = []

    def train_step(self, batch: Batch) -> dict[str, float]:
        self.trained.append(batch.batch_id)
        return {}

    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        return []

    def export_weights(self) -> dict[str, Any]:
        return {}

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "trained.json").write_text(json.dumps(self.trained))

    def load_checkpoint(self, path: str) -> None:
        self.trained = json.loads((Path(path) / "trained.json").read_text())


def _batch(i: int) -> Batch:
    b = TrajectoryBuilder(f"task-{i}", "lease")
    b.add_context([4, 5, 13])
    b.add_generation("policy", Generation([5, 2], [-0.7, -0.2], "stop", 0))
    return Batch(f"batch-{i}", "policy", [TrainItem(b.build("policy", 1.0), 0.5)], 0)


def _train(checkpoints: Checkpointer, backend: _Counting, progress: Progress,
           batches: range, last: int) -> None:
    leader = Leader(backend, None)
    for i in batches:
        batch = _batch(i)
        leader.train_step(batch)
        progress.step += 1
        progress.version += 1
        checkpoints.record(leader, progress, batch, last=progress.step == last)


def test_a_restarted_trainer_resumes_from_its_checkpoint_and_journal(tmp_path):
    checkpoints = Checkpointer(tmp_path, "policy", interval=3600.0)
    checkpoints.save_seconds, checkpoints.saved_at = 0.0, -1e9  # the first step is due
    backend, progress = _Counting(), Progress()
    _train(checkpoints, backend, progress, range(1, 5), last=10)
    # step 1 checkpointed, steps 2-4 journalled: killed here, nothing of them is lost
    again, resumed = _Counting(), Progress()
    assert Checkpointer(tmp_path, "policy", 3600.0).resume(Leader(again, None), resumed)
    assert again.trained == backend.trained == [f"batch-{i}" for i in range(1, 5)]
    assert (resumed.step, resumed.version, resumed.trained_batch) == (4, 4, "batch-4")


def test_the_last_step_checkpoints_and_empties_the_journal(tmp_path):
    checkpoints = Checkpointer(tmp_path, "policy", interval=3600.0)
    backend, progress = _Counting(), Progress()
    _train(checkpoints, backend, progress, range(1, 4), last=3)
    assert not checkpoints.journal.path.exists()
    meta = json.loads((tmp_path / "checkpoints" / "policy" / "runtime.json").read_text())
    assert meta == {"version": 3, "step": 3, "batch_id": "batch-3"}


def test_checkpoints_are_spaced_to_nine_times_their_writing():
    checkpoints = Checkpointer(Path("unused"), "policy", interval=1.0)
    checkpoints.saved_at -= 5.0  # 5 s since the last one
    assert checkpoints.due()
    checkpoints.save_seconds = 1.0  # writing takes 1 s: one at most every 9 s
    assert not checkpoints.due()
    assert Checkpointer(Path("unused"), "policy", interval=0.0).due()  # 0: every step
