"""A trainer killed after checkpointing but before acknowledging trains that batch once."""

from __future__ import annotations

import json

import pytest

from astraflow.config import compose_config
from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import settings_from_config
from astraflow.trainer.runtime import TrainerRuntime
from astraflow.types import Generation
from astraflow.workflows.builder import TrajectoryBuilder

TOKEN = "ack-test-token"


class Killed(Exception):
    """Stands for SIGKILL at the one instant that matters: after the checkpoint."""


def _feed(client: DataflowClient, tasks: int) -> None:
    client.register("raas", capacity=tasks)
    for lease in client.lease_tasks(max_tasks=tasks):
        group = []
        for i in range(4):
            builder = TrajectoryBuilder(lease.task.task_id, lease.lease_id)
            builder.add_context([4, 5, 13])
            builder.add_generation("policy", Generation([5 + i % 2, 2], [-0.7, -0.2], "stop", 0))
            group.append(builder.build("policy", float(i % 2)))
        assert client.submit(lease, group)["status"] == "accepted"


def test_the_unacknowledged_batch_is_acknowledged_not_retrained(tmp_path, tiny_model_dir):
    cfg = compose_config([f"run_dir={tmp_path}", f"model.path={tiny_model_dir}", "steps=2",
                          "batch_size=8", "group_size=4"])
    with BackgroundServer(settings_from_config(cfg), TOKEN) as srv, \
            DataflowClient(srv.url, TOKEN) as feeder:
        _feed(feeder, 4)  # two batches of 8
        first = TrainerRuntime(cfg, srv.url, TOKEN, "policy", str(tmp_path))

        def die(*args, **kwargs):
            raise Killed

        first.client.ack_batch = die
        with pytest.raises(Killed):
            first.run(steps=1)
        checkpoint = json.loads((tmp_path / "checkpoints" / "policy" / "runtime.json").read_text())
        assert checkpoint["step"] == 1

        restarted = TrainerRuntime(cfg, srv.url, TOKEN, "policy", str(tmp_path))
        restarted.run(steps=2)
        status = feeder.status()["policies"]["policy"]
        records = [json.loads(line) for line in (tmp_path / "metrics-policy.jsonl").open()]
    # the re-served first batch was acknowledged, not trained again, so the second step
    # trained the second batch (retraining would have left it unconsumed at steps=2)
    assert [r["step"] for r in records] == [2]
    assert status["consumed"] == 16 and status["outstanding_batches"] == 0


def test_a_trainer_killed_between_its_checkpoint_renames_resumes_and_saves_again(
        tmp_path, tiny_model_dir):
    cfg = compose_config([f"run_dir={tmp_path}", f"model.path={tiny_model_dir}", "steps=3",
                          "batch_size=8", "group_size=4"])
    ckpt = tmp_path / "checkpoints" / "policy"
    with BackgroundServer(settings_from_config(cfg), TOKEN) as srv, \
            DataflowClient(srv.url, TOKEN) as feeder:
        _feed(feeder, 6)  # three batches of 8
        TrainerRuntime(cfg, srv.url, TOKEN, "policy", str(tmp_path)).run(steps=1)
        # SIGKILL between the save's two renames: the last checkpoint is only in .old, and
        # the next one was half written
        ckpt.rename(ckpt.with_name("policy.old"))
        (tmp_path / "checkpoints" / "policy.tmp").mkdir()
        (tmp_path / "checkpoints" / "policy.tmp" / "shard").write_text("half")

        TrainerRuntime(cfg, srv.url, TOKEN, "policy", str(tmp_path)).run(steps=3)
        status = feeder.status()["policies"]["policy"]
    records = [json.loads(line) for line in (tmp_path / "metrics-policy.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert json.loads((ckpt / "runtime.json").read_text())["step"] == 3
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["policy"]
    assert status["consumed"] == 24 and status["outstanding_batches"] == 0
