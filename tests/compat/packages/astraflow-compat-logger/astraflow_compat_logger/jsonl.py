"""``logger=compat_jsonl``: a line when it opens, one per record that measures something
(its kind, policy, step and named scalars), and one when it closes."""

from __future__ import annotations

import json
import os
from typing import Any

import astraflow
from astraflow.contracts import MetricLogger
from astraflow.loggers.base import scalars


class JsonlLogger(MetricLogger):
    def __init__(self, config: Any, run_dir: str, run_config: dict[str, Any]) -> None:
        super().__init__(config, run_dir, run_config)
        self.file = open(os.path.join(run_dir, config.file), "a")  # noqa: SIM115
        self._write({"event": "open", "astraflow": astraflow.__version__,
                     "steps": run_config.get("steps")})

    def _write(self, line: dict[str, Any]) -> None:
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()

    def log(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            point = scalars(record)
            if point is not None:
                step, values = point
                self._write({"kind": record["kind"], "policy": record["policy"],
                             "step": step, "scalars": values})

    def close(self) -> None:
        self._write({"event": "close"})
        self.file.close()
