"""What the data layer needs to know about a run, from the run config or from CLI flags.

The service never reads the whole run config: the launcher (or ``astraflow dataflow
--config resolved.yaml``) reduces it to a :class:`DataflowSettings`, so the service can
also be started alone with a handful of flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from astraflow.errors import ConfigError

ORDERS = ("fifo", "edf")


@dataclass
class DataflowSettings:
    """Run settings of one data-layer service.

    ``policies`` maps each policy to its ``max_staleness`` (in weight versions).
    ``task`` is the task option's config (with ``name``) or None when tasks only
    arrive over HTTP; ``data`` maps data-algorithm names to their option configs.
    """

    store: str
    policies: dict[str, int] = field(default_factory=lambda: {"policy": 2})
    group_size: int = 8
    batch_size: int = 32
    order: str = "fifo"
    lease_seconds: float = 60.0
    buffer_capacity: int = 4096
    heartbeat_timeout: float = 30.0
    #: at a run's end, tasks for this many batches beyond the trainers' last are issued,
    #: so the last batches take the first groups back instead of waiting for the
    #: slowest (0: exactly what the run needs; the spare is left over, reported apart)
    end_spare_batches: int = 1
    task: Any = None
    data: dict[str, Any] = field(default_factory=dict)
    max_body_bytes: int = 64 * 1024 * 1024
    autoscale_window: float = 60.0
    #: SQLite ``synchronous``: NORMAL survives a killed process; FULL also a power cut
    synchronous: str = "NORMAL"
    #: mount ``POST /v1/echo`` (answers any body with its size: the ceiling
    #: ``bench/dataflow.py`` measures ingest against); never in a run
    bench_echo: bool = False

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ConfigError(f"dataflow.order={self.order!r}; choose {' or '.join(ORDERS)}")
        if not self.policies:
            raise ConfigError("dataflow needs at least one policy")
        for name, staleness in self.policies.items():
            if int(staleness) < 0:
                raise ConfigError(f"policies.{name}.max_staleness={staleness}: versions a sample "
                                  "may lag the weights it is trained on, 0 or more")
        for key in ("group_size", "batch_size", "buffer_capacity"):
            if getattr(self, key) < 1:
                raise ConfigError(f"dataflow {key} must be >= 1, got {getattr(self, key)}")
        if self.end_spare_batches < 0:
            raise ConfigError(f"dataflow.end_spare_batches={self.end_spare_batches}; must be "
                              ">= 0")
        if self.lease_seconds <= 0 or self.heartbeat_timeout <= 0:
            raise ConfigError("dataflow lease_seconds and heartbeat_timeout must be > 0")
        if self.synchronous.upper() not in ("NORMAL", "FULL"):
            raise ConfigError(f"dataflow synchronous must be NORMAL or FULL: {self.synchronous}")

    @property
    def store_path(self) -> Path:
        return Path(self.store)


def _plain(node: Any) -> Any:
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.asdict(node)
    return node


def settings_from_config(cfg: Any, store: str | None = None) -> DataflowSettings:
    """Reduce a run config (``AstraFlowConfig`` or its composed DictConfig) to settings.

    The store defaults to ``dataflow.store``, else ``<run_dir>/store``.
    """
    df = cfg.dataflow
    store = store or df.store or (str(Path(cfg.run_dir) / "store") if cfg.run_dir else None)
    if store is None:
        raise ConfigError("dataflow needs a store directory: set dataflow.store or run_dir")
    policies = {name: int(_plain(p)["max_staleness"]) for name, p in cfg.policies.items()}
    data = {name: _plain(opt) for name, opt in (cfg.data or {}).items()}
    return DataflowSettings(
        store=str(store),
        policies=policies,
        group_size=int(cfg.group_size),
        batch_size=int(cfg.batch_size),
        order=str(df.order),
        lease_seconds=float(df.lease_seconds),
        buffer_capacity=int(df.buffer_capacity),
        heartbeat_timeout=float(df.heartbeat_timeout),
        end_spare_batches=int(df.get("end_spare_batches", 1)),
        task=_plain(cfg.task),
        data=data,
    )


def settings_from_yaml(path: str | Path, store: str | None = None) -> DataflowSettings:
    """Settings from a resolved run config written by the launcher."""
    from astraflow.config import AstraFlowConfig

    loaded = OmegaConf.load(path)
    schema = OmegaConf.structured(AstraFlowConfig)
    if "policies" in loaded:
        schema.policies = {}  # the run's policies replace the default one, not join it
    cfg = OmegaConf.merge(schema, loaded)
    return settings_from_config(cfg, store=store)
