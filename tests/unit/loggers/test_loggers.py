"""Loggers: the launcher's feed of a run's records, records as named scalars, and a
missing library or bad setting stopping a run before it starts. A real run logging to
TensorBoard, W&B and MLflow, read back with each library's own reader, is the smoke
run of tests/system/e2e/test_e2e_launcher.py."""

from __future__ import annotations

import json

from astraflow.loggers.base import MetricsFeed, scalars


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


