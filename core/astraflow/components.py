"""What every component builds from the run config: workflow, roles, backends."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from astraflow.errors import ConfigError
from astraflow.plugins import get_registry


def load_config(path: str) -> DictConfig:
    """A resolved run config as written by the launcher (``run_dir/config.yaml``)."""
    if not Path(path).is_file():
        raise ConfigError(f"--config {path}: no such file (a component takes the "
                          "config.yaml its run's launcher wrote in the run directory)")
    return cast(DictConfig, OmegaConf.load(path))  # a run config is a map


def policy_names(cfg: Any) -> list[str]:
    return list(cfg.policies)


def build_workflow(cfg: Any, tokenizer: Any):
    """The workflow and its reward, built through the registry."""
    registry = get_registry()
    reward = registry.get("reward", cfg.reward.name).create(cfg.reward)
    workflow = registry.get("workflow", cfg.workflow.name).create(cfg.workflow, tokenizer, reward)
    return workflow


def role_map(cfg: Any, roles: tuple[str, ...]) -> dict[str, str]:
    """Workflow role -> policy name: by name, or the single policy for a single role."""
    names = policy_names(cfg)
    if all(role in names for role in roles):
        return {role: role for role in roles}
    if len(roles) == 1 and len(names) == 1:
        return {roles[0]: names[0]}
    raise ConfigError(
        f"workflow={cfg.workflow.name} needs policies {list(roles)} but the config defines "
        f"{names}; set policies to those names"
    )


def trainer_settings(cfg: DictConfig, policy: str) -> DictConfig:
    """The trainer config with this policy's overrides applied."""
    trainer = cast(DictConfig, OmegaConf.create(OmegaConf.to_container(cfg.trainer,
                                                                       resolve=True)))
    own = cfg.policies.get(policy) or cfg.policies.get("policy") or {}
    lr = own.get("lr")
    if lr is not None and "lr" in trainer:
        trainer.lr = lr
    world = own.get("world_size")
    if world is not None:
        trainer.world_size = world
    if trainer.get("total_steps") == 0:
        trainer.total_steps = cfg.steps  # a schedule spans the run unless told otherwise
    return trainer


def resolve_policies(cfg: DictConfig) -> dict[str, Any]:
    """One policy per workflow role.

    A role's settings come from ``policies.<role>``, else from ``policies.policy`` (the
    template every run has), else the defaults. Any other name is a typo: an error.
    """
    from astraflow.config import PolicyConfig

    workflow_cls: Any = get_registry().get("workflow", cfg.workflow.name).load()
    roles = workflow_cls.roles_for(cfg.workflow)
    given: dict[str, Any] = (
        cast(dict[str, Any], OmegaConf.to_container(cfg.policies, resolve=True))
        if cfg.policies else {})
    unknown = set(given) - set(roles) - {"policy"}
    if unknown:
        raise ConfigError(f"policies {sorted(unknown)} are not roles of "
                          f"workflow={cfg.workflow.name} (roles: {list(roles)})")
    template = given.get("policy") or dataclasses.asdict(PolicyConfig())
    return {role: given.get(role, template) for role in roles}
