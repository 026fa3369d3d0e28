"""What every logger shares: records as named scalars, the launcher's incremental read of
the run's metric streams, and the set of selected loggers it feeds."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from astraflow.contracts import MetricLogger
from astraflow.errors import ConfigError
from astraflow.plugins import get_registry, typed_config

log = logging.getLogger("astraflow.loggers")
#: record keys that locate a record rather than measure anything
_NOT_METRICS = {"step", "time", "version", "kind", "policy", "node"}


def scalars(record: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """A record as (step, {name: value}): a train record's numbers as
    ``POLICY/train/KEY`` at its step, an eval record's as ``POLICY/eval/KEY`` at the
    policy version it measured, a node's weight load as ``POLICY/refresh/KEY`` at the
    version loaded; other records (launcher events) give None."""
    kind, policy = record.get("kind"), record.get("policy")
    if kind not in ("train", "eval", "refresh") or policy is None:
        return None
    step = record.get("step" if kind == "train" else "version")
    if not isinstance(step, int):
        return None
    values = {}
    for key, value in record.items():
        if key in _NOT_METRICS or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            # "train/loss" under POLICY/train/ is "loss"; "eval_accuracy" "accuracy"
            name = key.removeprefix(f"{kind}/").removeprefix(f"{kind}_")
            values[f"{policy}/{kind}/{name}"] = float(value)
    return step, values


def points(records: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int,
                                                            dict[str, float]]]:
    """(record, step, scalars) of each record that measures something."""
    for record in records:
        point = scalars(record)
        if point is not None and point[1]:
            yield record, *point


def need(module: str, option: str, extra: str) -> None:
    """A one-line ConfigError when the library ``option`` needs is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{option} needs {module}: pip install 'astraflow[{extra}]'")


class MetricsFeed:
    """The run's metric streams (``metrics/*.jsonl``), read from where the last read
    stopped: each call returns only records completed since."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = Path(run_dir) / "metrics"
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.folder.glob("*.jsonl")):
            start = self.offsets.get(path, 0)
            try:
                with path.open("rb") as fh:
                    fh.seek(start)
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line being written waits for the next read
            self.offsets[path] = start + end
            for line in data[:end].splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return sorted(out, key=lambda r: r.get("time", 0.0))


def selected(cfg: DictConfig) -> dict[str, Any]:
    """The run's ``logger`` options, each with its typed settings."""
    registry = get_registry()
    out = {}
    for name, conf in (cfg.get("logger") or {}).items():
        entry = registry.get("logger", str(name))
        out[str(name)] = (entry, typed_config(entry.config_cls, conf))
    return out


def check_loggers(cfg: DictConfig) -> None:
    """Each selected logger judges its settings and its library before anything starts."""
    for entry, config in selected(cfg).values():
        entry.load().check_config(config)


def _switched_off(name: str, exc: Exception) -> None:
    print(f"astraflow: warning: logger={name} failed and is switched off: "
          f"{type(exc).__name__}: {exc}", file=sys.stderr)


class Loggers:
    """The selected loggers, fed the run's records as the launcher reads them. One that
    fails is reported once on the console and dropped; the run goes on."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.feed = MetricsFeed(run_dir)
        self.cfg, self.run_dir = cfg, run_dir
        self.loggers: dict[str, MetricLogger] | None = None

    def open(self) -> dict[str, MetricLogger]:
        """Make the loggers (once): their libraries load now (tensorboardX imports
        torch), so the launcher calls it once the components are starting."""
        if self.loggers is None:
            run_config = OmegaConf.to_container(self.cfg, resolve=True)
            self.loggers = {}
            for name, (entry, config) in selected(self.cfg).items():
                try:
                    self.loggers[name] = entry.create(config, str(self.run_dir), run_config)
                except Exception as exc:  # a logging service down must not stop training
                    _switched_off(name, exc)
        return self.loggers

    def _each(self, what: str, *args: Any) -> None:
        loggers = self.open()
        for name, logger in list(loggers.items()):
            try:
                getattr(logger, what)(*args)
            except Exception as exc:  # a logging service down must not stop training
                _switched_off(name, exc)
                del loggers[name]

    def update(self) -> None:
        records = self.feed.read()
        if records:
            self._each("log", records)

    def close(self) -> None:
        if self.loggers is None:  # the run stopped before its components started
            return
        self.update()
        self._each("close")
