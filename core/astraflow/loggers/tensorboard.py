"""``logger=tensorboard`` (the default): TensorBoard event files in the run directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from astraflow.contracts import MetricLogger
from astraflow.loggers.base import points
from astraflow.schema import setting


@dataclass
class TensorBoardConfig:
    """Event files for ``tensorboard --logdir RUN_DIR/tensorboard``."""

    #: relative to the run directory, or absolute
    dir: str = "tensorboard"
    #: seconds between flushes to disk
    flush_seconds: float = setting(10.0, gt=0)


def _summary_writer() -> Any:
    """tensorboardX's writer, imported without torch where torch is not loaded yet:
    tensorboardX imports torch (when it is installed) only to accept its tensors, and
    this logger writes floats. In the launcher that import was 1.1 s of CPU taken from
    the components starting beside it; torch stays importable afterwards."""
    import sys

    absent = "torch" not in sys.modules
    if absent:
        sys.modules["torch"] = None  # type: ignore[assignment]  # an ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if absent:
            del sys.modules["torch"]
    return SummaryWriter


class TensorBoardLogger(MetricLogger):
    def __init__(self, config: Any, run_dir: str, run_config: dict[str, Any]) -> None:
        super().__init__(config, run_dir, run_config)
        SummaryWriter = _summary_writer()

        self.writer = SummaryWriter(os.path.join(run_dir, config.dir),
                                    flush_secs=int(max(1, config.flush_seconds)))

    def log(self, records: list[dict[str, Any]]) -> None:
        for record, step, values in points(records):
            for name, value in values.items():
                self.writer.add_scalar(name, value, step, walltime=record.get("time"))

    def close(self) -> None:
        self.writer.close()
