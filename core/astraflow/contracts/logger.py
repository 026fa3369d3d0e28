"""The metric-logger contract: where a run's metrics go while it runs (``logger=``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class MetricLogger(ABC):
    """Receives every metric record of a run as the launcher reads it, in time order.

    A record is a dict with ``kind`` (``train``: one trainer step, ``eval``: one
    held-out evaluation, ``launcher``: an event such as a restart), ``policy`` for
    train and eval records, ``step`` (train) or ``version`` (eval), ``time`` (epoch
    seconds), and its numbers (``reward_mean``, ``train/loss``, ``eval_accuracy``...).
    :func:`astraflow.loggers.base.scalars` turns one into named scalars at a step.

    ``config`` is the option's settings, ``run_dir`` the run directory, and
    ``run_config`` the run's resolved config as plain data (to record with the run).
    """

    def __init__(self, config: Any, run_dir: str, run_config: dict[str, Any]) -> None:
        self.config = config
        self.run_dir = run_dir
        self.run_config = run_config

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise ConfigError (one line) for settings or a missing library, before the
        run starts anything."""

    @abstractmethod
    def log(self, records: list[dict[str, Any]]) -> None:
        """Send these records (new since the last call)."""

    def close(self) -> None:
        """The run is over (or stopped): flush and let go of files and connections."""
