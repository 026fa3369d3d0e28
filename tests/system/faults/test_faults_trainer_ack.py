"""A trainer killed after checkpointing but before acknowledging trains that batch once."""

from __future__ import annotations

import json
import threading
import time

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


def _final_weights(work_dir) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(work_dir / "final" / "policy" / "model.safetensors"))


def test_a_trainer_killed_between_checkpoints_trains_its_journal_again_and_ends_the_same(
        tmp_path, tiny_model_dir):
    """With checkpoints far apart, the batches trained since the last one are not lost:
    the restarted trainer ends with the very weights of a trainer never killed."""
    runs = {}
    for name, kill_at_ack in (("killed", 2), ("whole", None)):
        work = tmp_path / name
        cfg = compose_config([f"run_dir={work}", f"model.path={tiny_model_dir}", "steps=3",
                              "batch_size=8", "group_size=4", "checkpoint_interval=3600"])
        with BackgroundServer(settings_from_config(cfg), TOKEN) as srv, \
                DataflowClient(srv.url, TOKEN) as feeder:
            _feed(feeder, 6)  # three batches of 8
            if kill_at_ack:
                first = TrainerRuntime(cfg, srv.url, TOKEN, "policy", str(work))
                acks, ack = [], first.client.ack_batch

                def die(*args, ack=ack, acks=acks, at=kill_at_ack, **kwargs):
                    acks.append(1)
                    if len(acks) == at:
                        raise Killed
                    return ack(*args, **kwargs)

                first.client.ack_batch = die
                with pytest.raises(Killed):
                    first.run(steps=3)
                # killed at step 2's acknowledgement, with no checkpoint yet: both steps
                # are only in the journal
                assert not (work / "checkpoints" / "policy").exists()
            restarted = threading.Thread(
                target=TrainerRuntime(cfg, srv.url, TOKEN, "policy", str(work)).run,
                kwargs={"steps": 3}, daemon=True)
            restarted.start()
            restarted.join(timeout=300)
            # a trainer that lost a batch waits for one more than the three there are
            assert not restarted.is_alive(), f"{name}: the trainer never reached step 3"
            runs[name] = feeder.status()["policies"]["policy"]
    assert runs["killed"]["consumed"] == runs["whole"]["consumed"] == 24
    assert runs["killed"]["outstanding_batches"] == 0
    killed, whole = _final_weights(tmp_path / "killed"), _final_weights(tmp_path / "whole")
    assert killed.keys() == whole.keys()
    for name, tensor in whole.items():
        assert (killed[name] == tensor).all(), name
    assert json.loads((tmp_path / "killed" / "checkpoints" / "policy" / "runtime.json"
                       ).read_text())["step"] == 3
    assert not (tmp_path / "killed" / "checkpoints" / "policy.journal").exists()


def test_a_journal_record_cut_short_by_a_kill_is_dropped_and_the_next_append_reads(tmp_path):
    from astraflow.trainer.journal import BatchJournal
    from astraflow.types import Batch, TrainItem

    def batch(i: int) -> Batch:
        b = TrajectoryBuilder(f"task-{i}", "lease")
        b.add_context([4, 5, 13])
        b.add_generation("policy", Generation([5, 2], [-0.7, -0.2], "stop", i))
        return Batch(f"batch-{i}", "policy", [TrainItem(b.build("policy", 1.0), 0.5)], i)

    path = tmp_path / "policy.journal"
    journal = BatchJournal(path)
    journal.append(1, 1, batch(1))
    journal.append(2, 2, batch(2))
    journal.close()
    whole = path.stat().st_size
    path.write_bytes(path.read_bytes()[:whole - 7])  # killed in the middle of record 2
    recovered = BatchJournal(path).recover()
    assert [(step, b.batch_id) for step, _v, b in recovered] == [(1, "batch-1")]
    # float32, as the data layer serves them
    assert recovered[0][2].items[0].trajectory.logprobs == pytest.approx(
        batch(1).items[0].trajectory.logprobs, abs=1e-6)
    again = BatchJournal(path)
    again.append(2, 2, batch(3))
    again.close()
    assert [b.batch_id for _s, _v, b in BatchJournal(path).recover()] == ["batch-1", "batch-3"]


def test_the_trainer_fetches_its_next_batch_while_it_trains(tmp_path, tiny_model_dir):
    """The next batch is served while a step trains, for the version it is trained at,
    so a step does not wait for the fetch; every batch is trained once, in order."""
    from astraflow.testing import wait_until

    cfg = compose_config([f"run_dir={tmp_path}", f"model.path={tiny_model_dir}", "steps=3",
                          "batch_size=8", "group_size=4"])
    trained: list[tuple[str, int, int]] = []
    with BackgroundServer(settings_from_config(cfg), TOKEN) as srv, \
            DataflowClient(srv.url, TOKEN) as feeder:
        _feed(feeder, 6)  # three batches of 8

        def held() -> int:
            return feeder.status()["policies"]["policy"]["outstanding_batches"]

        class Watched(TrainerRuntime):
            def _build(self):
                backend = super()._build()
                step = backend.train_step

                def train_step(batch):
                    trained.append((batch.batch_id, batch.trainer_version, held()))
                    if len(trained) < 3:  # the last step has no next batch to fetch
                        wait_until(lambda: held() == 2, timeout=30,
                                   what="the next batch served during the step")
                    return step(batch)

                backend.train_step = train_step
                return backend

        Watched(cfg, srv.url, TOKEN, "policy", str(tmp_path)).run(steps=3)
        status = feeder.status()["policies"]["policy"]
    assert len({batch_id for batch_id, _, _ in trained}) == 3
    # each batch says the version it was trained at: 0, 1, 2
    assert [version for _, version, _ in trained] == [0, 1, 2]
    assert status["consumed"] == 24 and status["outstanding_batches"] == 0


def test_a_step_s_weights_are_published_while_the_next_step_trains(tmp_path, tiny_model_dir):
    """Step 2 starts training before step 1's weights are published and its batch
    acknowledged (they go on a thread of their own); still every version is published
    and every batch acknowledged once, in order."""
    import threading

    from astraflow.weights.client import WeightClient

    cfg = compose_config([f"run_dir={tmp_path}", f"model.path={tiny_model_dir}", "steps=3",
                          "batch_size=8", "group_size=4"])
    second_step = threading.Event()
    with BackgroundServer(settings_from_config(cfg), TOKEN) as srv, \
            DataflowClient(srv.url, TOKEN) as feeder:
        _feed(feeder, 6)  # three batches of 8

        class Watched(TrainerRuntime):
            def _build(self):
                backend = super()._build()
                step = backend.train_step

                def train_step(batch):
                    if backend.step == 1:
                        second_step.set()
                    return step(batch)

                backend.train_step = train_step
                return backend

            def _finish(self, publisher, batch, metrics, step, version, weights, times):
                # published one after the other, step 1's publish would wait forever
                if step == 1 and not second_step.wait(timeout=30):
                    raise AssertionError("step 2 did not train while step 1 was published")
                super()._finish(publisher, batch, metrics, step, version, weights, times)

        Watched(cfg, srv.url, TOKEN, "policy", str(tmp_path)).run(steps=3)
        status = feeder.status()["policies"]["policy"]
        with WeightClient(srv.url, TOKEN, tmp_path / "check") as weights:
            latest = weights.latest("policy")
    records = [json.loads(line) for line in (tmp_path / "metrics-policy.jsonl").open()]
    assert [(r["step"], r["version"]) for r in records] == [(1, 1), (2, 2), (3, 3)]
    assert latest == 3
    assert status["consumed"] == 24 and status["outstanding_batches"] == 0


#: seconds the slow publish below lasts past step 2's training
SLOW_UPLOAD = 1.0


def test_a_publish_behind_the_next_step_is_not_counted_in_the_step(tmp_path, tiny_model_dir):
    """The data layer paces rollouts by the trainer's steps: a publish that runs behind
    the next step is reported as the publish's time, not the step's."""
    cfg = compose_config([f"run_dir={tmp_path}", f"model.path={tiny_model_dir}", "steps=2",
                          "batch_size=8", "group_size=4"])
    trained = threading.Event()
    with BackgroundServer(settings_from_config(cfg), TOKEN) as srv, \
            DataflowClient(srv.url, TOKEN) as feeder:
        _feed(feeder, 4)  # two batches of 8

        class SlowPublish:
            """Step 1's publish lasts until step 2 has trained."""

            def __init__(self, publisher):
                self.publisher = publisher

            def publish(self, version, tensors, **options):
                if version == 1:
                    if not trained.wait(timeout=30):
                        raise AssertionError("step 2 did not train while step 1 was "
                                             "published")
                    # a slow upload: longer than any step of the tiny model, so that a
                    # step charged with it could not pass for one that is not
                    time.sleep(SLOW_UPLOAD)
                return self.publisher.publish(version, tensors, **options)

        class Watched(TrainerRuntime):
            def _build(self):
                backend = super()._build()
                step = backend.train_step

                def train_step(batch):
                    out = step(batch)
                    if backend.step == 2:
                        trained.set()
                    return out

                backend.train_step = train_step
                return backend

            def _finish(self, publisher, *args):
                super()._finish(SlowPublish(publisher), *args)

        Watched(cfg, srv.url, TOKEN, "policy", str(tmp_path)).run(steps=2)
    first, second = [json.loads(line) for line in (tmp_path / "metrics-policy.jsonl").open()]
    assert (first["step"], second["step"]) == (1, 2)
    # step 1's publish outlasted step 2's training, and step 1 is not charged for it
    assert first["publish_seconds"] >= SLOW_UPLOAD > first["step_seconds"]
