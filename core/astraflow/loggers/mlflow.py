"""``logger=mlflow``: an MLflow run per AstraFlow run, in a local store under the run
directory by default (``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri
RUN_DIR/mlruns``), or a tracking server or database (``logger.mlflow.tracking_uri=
http://...``, ``sqlite:///...`` with the full ``mlflow`` package).

The default store is MLflow's file store, which needs no server and no database
driver (``mlflow-skinny`` suffices); MLflow keeps it in maintenance mode and asks for
``MLFLOW_ALLOW_FILE_STORE=true``, which this logger sets for its own store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from astraflow.contracts import MetricLogger
from astraflow.loggers.base import need, points

#: MLflow metric names allow letters, digits, _ - . / and spaces
_KEEP = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./ ")


@dataclass
class MLflowConfig:
    """Metrics as MLflow metrics, the resolved config as parameters and an artifact."""

    #: null: a file store in RUN_DIR/mlruns
    tracking_uri: str | None = None
    experiment: str = "astraflow"
    #: null: the run directory's name
    run_name: str | None = None


def _metric_name(name: str) -> str:
    return "".join(ch if ch in _KEEP else "_" for ch in name)


class MLflowLogger(MetricLogger):
    @classmethod
    def check_config(cls, config: Any) -> None:
        need("mlflow", "logger=mlflow", "mlflow")

    def __init__(self, config: Any, run_dir: str, run_config: dict[str, Any]) -> None:
        super().__init__(config, run_dir, run_config)
        from mlflow.tracking import MlflowClient

        self.uri = config.tracking_uri or "file:" + os.path.join(run_dir, "mlruns")
        if not config.tracking_uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(config.experiment)
        experiment = (found.experiment_id if found is not None
                      else self.client.create_experiment(config.experiment))
        run = self.client.create_run(
            experiment, run_name=config.run_name or os.path.basename(run_dir.rstrip("/")))
        self.run_id = run.info.run_id
        self.client.log_dict(self.run_id, run_config, "config.yaml")
        params = {k: str(v)[:500] for k, v in _flat(run_config).items()}
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes 100 parameters a call
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def log(self, records: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        metrics = []
        for record, step, values in points(records):
            stamp = int(1000 * record.get("time", 0.0))
            metrics += [Metric(_metric_name(k), v, stamp, step) for k, v in values.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}
