"""The logger contract for MLflow's logger: its library runs ``uname`` as it starts."""

from __future__ import annotations

from astraflow.testing.contracts import LoggerContract


class TestLogger_mlflow(LoggerContract):
    option = "mlflow"
