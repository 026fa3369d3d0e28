"""``logger=wandb``: Weights & Biases, offline by default (files under the run
directory, no account needed; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads them),
or ``logger.wandb.mode=online`` with ``WANDB_API_KEY`` set."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from astraflow.contracts import MetricLogger
from astraflow.errors import ConfigError
from astraflow.loggers.base import need, points
from astraflow.schema import setting

MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    """A W&B run per AstraFlow run, its config the run's resolved config."""

    project: str = "astraflow"
    entity: str | None = None
    #: the W&B run's name; null: the run directory's name
    name: str | None = None
    #: offline (files only) | online (needs WANDB_API_KEY) | disabled
    mode: str = setting("offline", choices=MODES)
    tags: list[str] = field(default_factory=list)
    #: where W&B writes its files; null: the run directory (RUN_DIR/wandb)
    dir: str | None = None


class WandbLogger(MetricLogger):
    @classmethod
    def check_config(cls, config: Any) -> None:
        need("wandb", "logger=wandb", "wandb")
        if config.mode == "online" and not os.environ.get("WANDB_API_KEY"):
            raise ConfigError("logger.wandb.mode=online needs WANDB_API_KEY set (or run "
                              "offline, the default, and `wandb sync` later)")

    def __init__(self, config: Any, run_dir: str, run_config: dict[str, Any]) -> None:
        super().__init__(config, run_dir, run_config)
        import wandb

        self.run = wandb.init(
            project=config.project, entity=config.entity, mode=config.mode,
            name=config.name or os.path.basename(run_dir.rstrip("/")),
            dir=config.dir or run_dir, config=run_config, tags=list(config.tags),
            settings=wandb.Settings(silent=True, console="off"), reinit="create_new")
        self.defined: set[str] = set()

    def log(self, records: list[dict[str, Any]]) -> None:
        for _, step, values in points(records):
            # each policy's train and eval series on their own x axis (step, version):
            # W&B's global step must only grow, and policies step independently
            axis = "/".join(next(iter(values)).split("/")[:2]) + "/step"
            if axis not in self.defined:
                self.run.define_metric(axis)
                self.run.define_metric(axis.removesuffix("step") + "*", step_metric=axis)
                self.defined.add(axis)
            self.run.log({**values, axis: step})

    def close(self) -> None:
        self.run.finish()
