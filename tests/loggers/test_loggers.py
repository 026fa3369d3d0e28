"""``logger=[tensorboard,wandb,mlflow]``: a run's metrics reach each logger while it runs,
in offline / local files by default, and read back with each library's own reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.errors import ConfigError
from astraflow.loggers.base import MetricsFeed, need, scalars
from astraflow.testing import launch_run


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of the run's offline W&B file, read with W&B's own datastore."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def mlflow_history(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{run_dir / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("astraflow").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["steps"] == "3"  # the resolved config, as parameters
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, metric)]


@pytest.mark.slow
def test_a_run_logs_to_tensorboard_wandb_and_mlflow_offline(tmp_path, tiny_model_dir):
    pytest.importorskip("wandb.sdk.internal.datastore",
                        reason="W&B's offline-file reader (wandb<0.30, the dev extra)")
    run_dir = tmp_path / "run"
    launch_run(tmp_path, "+experiment=smoke", "logger=[tensorboard,wandb,mlflow]",
               f"model.path={tiny_model_dir}", "task.num_eval=8", "eval_samples=2",
               f"run_dir={run_dir}")
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = {r["step"]: r for r in train if r["kind"] == "train"}
    assert sorted(train) == [1, 2, 3]

    rows = [r for r in wandb_history(run_dir) if "policy/train/reward_mean" in r]
    assert [r["policy/train/step"] for r in rows] == [1, 2, 3]
    assert [r["policy/train/reward_mean"] for r in rows] == pytest.approx(
        [train[s]["reward_mean"] for s in (1, 2, 3)])
    assert all("policy/train/loss" in r for r in rows)
    evals = [r for r in wandb_history(run_dir) if "policy/eval/accuracy" in r]
    assert evals and all(0.0 <= r["policy/eval/accuracy"] <= 1.0 for r in evals)

    history = mlflow_history(run_dir, "policy/train/reward_mean")
    assert [step for step, _ in history] == [1, 2, 3]
    assert [value for _, value in history] == pytest.approx(
        [train[s]["reward_mean"] for s in (1, 2, 3)])
    assert len(mlflow_history(run_dir, "policy/train/loss")) == 3
    assert any((run_dir / "tensorboard").iterdir())


def test_the_feed_returns_each_complete_record_once(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    feed = MetricsFeed(tmp_path)
    assert feed.read() == []
    with (metrics / "train-policy.jsonl").open("w") as fh:
        fh.write(json.dumps({"kind": "train", "policy": "policy", "step": 1, "time": 2.0})
                 + "\n" + '{"kind": "train", "pol')  # the next line, half written
        fh.flush()
        (metrics / "eval-policy.jsonl").write_text(
            json.dumps({"kind": "eval", "policy": "policy", "version": 0, "time": 1.0}) + "\n")
        assert [r.get("step", r.get("version")) for r in feed.read()] == [0, 1]
        assert feed.read() == []
        fh.write('icy": "policy", "step": 2, "time": 3.0}\n')
    assert [r["step"] for r in feed.read()] == [2]


def test_records_become_named_scalars_at_their_step():
    step, values = scalars({"kind": "train", "policy": "solver", "step": 4, "time": 1.0,
                            "reward_mean": 0.5, "train/loss": 0.25, "pools": "default"})
    assert (step, values) == (4, {"solver/train/reward_mean": 0.5, "solver/train/loss": 0.25})
    assert scalars({"kind": "eval", "policy": "solver", "version": 7,
                    "eval_accuracy": 0.3}) == (7, {"solver/eval/accuracy": 0.3})
    assert scalars({"kind": "launcher", "event": "restart", "time": 1.0}) is None


def test_a_missing_library_or_a_bad_setting_is_one_line_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"^logger=x needs no_such_lib_xyz: pip install "
                                          r"'astraflow\[x\]'$"):
        need("no_such_lib_xyz", "logger=x", "x")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "astraflow", "logger=wandb",
                           "logger.wandb.mode=online", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "astraflow: error: logger.wandb.mode=online needs WANDB_API_KEY set (or run offline, "
        "the default, and `wandb sync` later)")
    assert not (tmp_path / "run").exists()
