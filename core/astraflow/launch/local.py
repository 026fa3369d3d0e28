"""The local launcher: every component as a subprocess of ``python -m astraflow``."""

from __future__ import annotations

from omegaconf import DictConfig

from astraflow.plugins import get_registry


def check_selection(cfg: DictConfig) -> None:
    """Fail fast, before any process starts, on an option that cannot run here."""
    registry = get_registry()
    registry.get("rollout_backend", cfg.raas.name).load()
    registry.get("trainer_backend", cfg.trainer.name).load()


def run(cfg: DictConfig) -> int:
    check_selection(cfg)
    raise NotImplementedError("the local launcher arrives with the end-to-end issue")
