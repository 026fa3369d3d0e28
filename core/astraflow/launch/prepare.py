"""A run's set-up before anything starts: every check that reads the user's files, the
run directory, the model (the built-in tiny one when ``model.path`` is unset) and the
resolved config written into the run directory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from astraflow.components import resolve_policies
from astraflow.config import ModelConfig
from astraflow.errors import ConfigError
from astraflow.loggers.base import check_loggers
from astraflow.plugins import get_registry


def prepare(cfg: DictConfig) -> tuple[DictConfig, Path]:
    """Check the set-up, resolve the run directory and the model, write the config.

    Every check that reads the user's files runs before the run directory is made, so
    a mistake leaves nothing behind and starts nothing.
    """
    cfg, run_dir, _ = prepare_run(cfg)
    return cfg, run_dir


def prepare_run(cfg: DictConfig) -> tuple[DictConfig, Path, bool]:
    """:func:`prepare`, and whether the task has a held-out split to evaluate."""
    from astraflow.launch import preflight

    cfg = cast(DictConfig, OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
    preflight.check_backends(cfg)
    cfg.policies = resolve_policies(cfg)
    preflight.resolve_paths(cfg)
    preflight.check_reward(cfg)
    preflight.check_workflow(cfg)
    check_loggers(cfg)
    if cfg.model.path is not None and "tokenizer" in cfg.task and not cfg.task.tokenizer:
        cfg.task.tokenizer = cfg.model.path  # the task source counts prompt tokens with it
    source = preflight.task_source(cfg)
    prompt_tokens = None
    if cfg.model.path is not None:
        prompt_tokens = preflight.check_prompts(cfg, source)
        preflight.check_lora(cfg)
    evaluated = bool(source.eval_tasks())
    preflight.check_memory(cfg, prompt_tokens, evaluated=evaluated)
    run_dir = Path(cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.run_dir = str(run_dir)
    if cfg.mode == "sync":  # the baseline trains only on what the current weights produced
        for policy in cfg.policies.values():
            policy.max_staleness = 0
    if cfg.model.path is None:
        from astraflow.models.tiny import make_tiny_model

        tasks = list(source.train_tasks())
        workflow_cls: Any = get_registry().get("workflow", cfg.workflow.name).load()
        examples = workflow_cls.warmstart_tasks(tasks, seed=cfg.seed)
        cache = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))
        model_cfg = cast(ModelConfig, OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model)))
        # as many passes over the task's own examples whatever else a workflow adds, so a
        # solver trained next to a verifier starts as strong as one trained alone
        model_cfg.warmstart_steps = math.ceil(
            model_cfg.warmstart_steps * len(examples) / max(len(tasks), 1))
        # one folder per model settings: runs with other settings (a smoke run's 0 warm-up
        # steps) rebuilt a shared folder under a run that had just loaded it
        settings = hashlib.sha256(json.dumps(dataclasses.asdict(model_cfg), sort_keys=True,
                                             default=str).encode()).hexdigest()[:10]
        out = cache / "models" / (f"tiny-{cfg.task.name}-{cfg.workflow.name}-seed{cfg.seed}"
                                  f"-{settings}")
        try:
            cfg.model.path = make_tiny_model(str(out), model_cfg, seed=cfg.seed,
                                             warmstart_tasks=examples)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model.path is unset, so the run would start from the built-in "
                              f"tiny model, which cannot learn task={cfg.task.name} ({exc}); "
                              "set model.path to your checkpoint") from exc
        if "tokenizer" in cfg.task and not cfg.task.tokenizer:
            cfg.task.tokenizer = cfg.model.path
        preflight.check_prompts(cfg, source)
        preflight.check_lora(cfg)
    OmegaConf.save(cfg, run_dir / "config.yaml")
    return cfg, run_dir, evaluated
