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
from astraflow.schema import (
    AstraFlowConfig,
    DataflowConfig,
    PolicyConfig,
    check_instance,
    like,
    setting,
    value_problem,
)

_RUN = {f.name: f for f in dataclasses.fields(AstraFlowConfig)}
_DATAFLOW = {f.name: f for f in dataclasses.fields(DataflowConfig)}
_STALENESS = next(f for f in dataclasses.fields(PolicyConfig) if f.name == "max_staleness")
#: the advantage estimator of a policy the settings name none for
DEFAULT_ADVANTAGE: str = str(next(
    f for f in dataclasses.fields(PolicyConfig) if f.name == "advantage").default)
ORDERS = _DATAFLOW["order"].metadata["astraflow"]["choices"]


@dataclass
class DataflowSettings:
    """Run settings of one data-layer service.

    ``policies`` maps each policy to its ``max_staleness`` (in weight versions; None:
    derived from the measured turnaround and trainer pace, :mod:`.versions`),
    ``advantages`` to the name of its advantage estimator (``policies.<name>.advantage``;
    a policy it does not name is given ``grpo``).
    ``task`` is the task option's config (with ``name``) or None when tasks only
    arrive over HTTP; ``data`` maps data-algorithm names to their option configs.
    The settings a run config also has take their defaults and ranges from its schema
    (:mod:`astraflow.schema`), so a service started alone runs as a launched one.
    """

    store: str
    policies: dict[str, int | None] = field(
        default_factory=lambda: {"policy": _STALENESS.default})  # type: ignore[dict-item]
    advantages: dict[str, str] = field(default_factory=dict)
    group_size: int = like(_RUN["group_size"])
    batch_size: int = like(_RUN["batch_size"])
    order: str = like(_DATAFLOW["order"])
    lease_seconds: float = like(_DATAFLOW["lease_seconds"])
    buffer_capacity: int = like(_DATAFLOW["buffer_capacity"])
    heartbeat_timeout: float = like(_DATAFLOW["heartbeat_timeout"])
    #: at a run's end, tasks for this many batches beyond the trainers' last are issued,
    #: so the last batches take the first groups back instead of waiting for the
    #: slowest (0: exactly what the run needs; the spare is left over, reported apart)
    end_spare_batches: int = like(_DATAFLOW["end_spare_batches"])
    #: seconds done tasks, acknowledged batches and departed nodes are remembered
    retain_seconds: float = like(_DATAFLOW["retain_seconds"])
    task: Any = None
    data: dict[str, Any] = field(default_factory=dict)
    max_body_bytes: int = setting(64 * 1024 * 1024, ge=1)
    autoscale_window: float = setting(60.0, gt=0)
    #: seconds the event loop may run late, its CPU busy, before new leases are refused
    #: with a growing ``retry_after`` (load shedding, :mod:`.overload`; 0: never)
    overload_lag: float = setting(0.05, ge=0)
    #: SQLite ``synchronous``: NORMAL survives a killed process; FULL also a power cut
    synchronous: str = setting("NORMAL", choices=("NORMAL", "FULL"))
    #: mount ``POST /v1/echo`` (answers any body with its size: the ceiling
    #: ``bench/dataflow.py`` measures ingest against); never in a run
    bench_echo: bool = False
    #: answer leases, submissions and heartbeats without the web framework
    #: (:mod:`.hotpath`); False serves them through it, the baseline bench/scale.py
    #: measures the fast path against
    hot_routes: bool = True

    def __post_init__(self) -> None:
        self.synchronous = self.synchronous.upper()
        if not self.policies:
            raise ConfigError("dataflow needs at least one policy")
        wrong = check_instance(self, "dataflow.") + [
            problem for name, staleness in self.policies.items()
            if staleness is not None and (problem := value_problem(
                f"policies.{name}.max_staleness", int(staleness), _STALENESS))]
        wrong += [f"advantages names {name!r}, which is not a policy of this run "
                  f"({', '.join(self.policies)})"
                  for name in self.advantages if name not in self.policies]
        if wrong:
            raise ConfigError("; ".join(wrong))
        self.advantages = {p: self.advantages.get(p, DEFAULT_ADVANTAGE) for p in self.policies}

    def advantage(self, policy: str) -> str:
        """The name of ``policy``'s advantage estimator."""
        return self.advantages.get(policy, DEFAULT_ADVANTAGE)

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
    plain = {name: _plain(p) for name, p in cfg.policies.items()}
    policies = {name: None if p.get("max_staleness") is None else int(p["max_staleness"])
                for name, p in plain.items()}
    advantages = {name: str(p.get("advantage") or DEFAULT_ADVANTAGE)
                  for name, p in plain.items()}
    data = {name: _plain(opt) for name, opt in (cfg.data or {}).items()}
    return DataflowSettings(
        store=str(store),
        policies=policies,
        advantages=advantages,
        group_size=int(cfg.group_size),
        batch_size=int(cfg.batch_size),
        order=str(df.order),
        lease_seconds=float(df.lease_seconds),
        buffer_capacity=int(df.buffer_capacity),
        heartbeat_timeout=float(df.heartbeat_timeout),
        end_spare_batches=int(df.end_spare_batches),
        retain_seconds=float(df.retain_seconds),
        task=_plain(cfg.task),
        data=data,
    )


def settings_from_yaml(path: str | Path, store: str | None = None) -> DataflowSettings:
    """Settings from a resolved run config written by the launcher."""
    loaded = OmegaConf.load(path)
    schema = OmegaConf.structured(AstraFlowConfig)
    if "policies" in loaded:
        schema.policies = {}  # the run's policies replace the default one, not join it
    cfg = OmegaConf.merge(schema, loaded)
    return settings_from_config(cfg, store=store)
