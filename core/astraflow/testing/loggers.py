"""Read a run's logged metrics back with each library's own reader (tests, and anyone
checking what a logger wrote)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of the run's offline W&B file, read with W&B's own datastore
    (wandb < 0.30)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = (Path(run_dir) / "wandb").glob("offline-run-*/run-*.wandb")
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


def mlflow_run(run_dir: Path, experiment: str = "astraflow"):
    """(client, run) of the run's MLflow file store."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{Path(run_dir) / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def mlflow_history(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    client, run = mlflow_run(run_dir)
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, metric)]
