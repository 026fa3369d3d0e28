"""Pre-flight: every set-up mistake stops the run before any component starts.

A bad path, a row without the prompt key, a tokenizer without an end-of-sequence
token, a reward file that does not import: each is found here, in the launcher's own
process, and reported in one line naming the file, the row or the key -- not by a
component that dies at start-up, is restarted and dies the same way again.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from astraflow.components import trainer_settings
from astraflow.errors import ConfigError
from astraflow.plugins import get_registry, typed_config
from astraflow.rl.options import lora_rank

#: prompts rendered with the run's tokenizer before anything starts
_SAMPLE_PROMPTS = 5


def check_backends(cfg: DictConfig) -> None:
    """Each selected backend judges its own config (e.g. whether it must start a server
    this machine lacks). With a registered ``check`` the engine is not imported here (an
    engine import costs seconds to tens of seconds of start-up); otherwise the factory's
    ``check_config``, which a factory that is not a contract class may omit."""
    registry = get_registry()
    # a policy's own trainer settings (its world_size) are judged as the trainer's
    own = [(str(name), trainer_settings(cfg, str(name)))
           for name, policy in (cfg.policies or {}).items()
           if policy and policy.get("world_size") is not None]
    for kind, policy, conf in (("rollout_backend", "", cfg.raas),
                               ("trainer_backend", "", cfg.trainer),
                               *(("trainer_backend", p, c) for p, c in own)):
        entry = registry.get(kind, conf.name)
        check = entry.checker() or getattr(entry.load(), "check_config", None)
        if callable(check):
            try:
                _judge(check, conf, cfg.model.path)
            except ValueError as exc:  # a backend says what is wrong; no traceback for it
                raise ConfigError(_for_policy(str(exc), policy)) from None
    if lora_rank(cfg.trainer) and not getattr(
            registry.get("rollout_backend", cfg.raas.name).load(), "supports_adapters", False):
        raise ConfigError(f"trainer.lora.rank={lora_rank(cfg.trainer)}: raas={cfg.raas.name} "
                          "cannot serve LoRA adapters; use raas=hf, vllm or sglang")
    if lora_rank(cfg.trainer) and cfg.model.path:
        _check_expert_adapters(cfg, registry.get("rollout_backend", cfg.raas.name).load())
    if cfg.trainer.get("router_replay") and not cfg.model.path:
        raise ConfigError("trainer.router_replay=true: the built-in tiny model has no "
                          "mixture-of-experts layer to replay; give model.path=<an MoE "
                          "checkpoint>")
    if cfg.trainer.get("router_replay") and not getattr(
            registry.get("rollout_backend", cfg.raas.name).load(), "supports_router_replay",
            False):
        raise ConfigError(f"trainer.router_replay=true: raas={cfg.raas.name} does not record "
                          "the experts it routes each token to; use raas=hf")


def _check_expert_adapters(cfg: DictConfig, engine: Any) -> None:
    """LoRA on a mixture-of-experts model's experts needs an engine that serves it."""
    from astraflow.lora import expert_targets
    from astraflow.rl.options import lora_targets

    try:
        experts = expert_targets(lora_targets(cfg.trainer.lora), cfg.model.path)
    except ValueError:
        return  # check_lora says what is wrong with the targets
    if experts and not getattr(engine, "supports_expert_adapters", False):
        raise ConfigError(f"trainer.lora.target_modules: {experts} adapt the experts of "
                          f"{cfg.model.path}, which raas={cfg.raas.name} cannot serve on "
                          "this machine; use raas=hf, or adapt the attention alone")


def _judge(check: Callable[..., Any], conf: Any, model_path: str | None) -> None:
    """A check that takes ``model_path`` judges the checkpoint too (a layout the backend
    cannot train, e.g. trainer=megatron given a mixture-of-experts model)."""
    try:
        takes_path = "model_path" in inspect.signature(check).parameters
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        takes_path = False
    if takes_path and model_path and Path(str(model_path)).expanduser().is_dir():
        check(conf, model_path=str(Path(str(model_path)).expanduser()))
    else:
        check(conf)


def _for_policy(message: str, policy: str) -> str:
    """A trainer check's message about a policy's own settings names the key the user
    set (``policies.verifier.world_size``, not ``trainer.world_size``)."""
    if not policy:
        return message
    own = message.replace("trainer.world_size", f"policies.{policy}.world_size")
    return own if own != message else f"policies.{policy}: {message}"


def check_lora(cfg: DictConfig) -> None:
    """Every ``trainer.lora.target_modules`` name adapts some layer of ``model.path``."""
    if not lora_rank(cfg.trainer):
        return
    from astraflow.lora import check_targets
    from astraflow.rl.options import lora_targets

    try:
        check_targets(lora_targets(cfg.trainer.lora), cfg.model.path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _absolute(value: Any, key: str) -> Any:
    if value is None or value == "":
        return value
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else Path.cwd() / path)


def resolve_paths(cfg: DictConfig) -> None:
    """Paths the user typed relative to their shell become absolute, so every component
    (started elsewhere, or with another working directory) reads the same files."""
    if cfg.model.path is not None:
        cfg.model.path = _absolute(cfg.model.path, "model.path")
        if not Path(cfg.model.path).is_dir():
            raise ConfigError(f"model.path={cfg.model.path} is not a directory")
    for key in ("train_files", "eval_files"):
        if cfg.task.get(key):
            cfg.task[key] = [_absolute(f, f"task.{key}") for f in cfg.task[key]]
    if cfg.task.get("tokenizer"):
        cfg.task.tokenizer = _absolute(cfg.task.tokenizer, "task.tokenizer")
    if cfg.reward.get("path"):
        cfg.reward.path = _absolute(cfg.reward.path, "reward.path")
    if cfg.workflow.get("path"):
        cfg.workflow.path = _absolute(cfg.workflow.path, "agent.path")


def check_workflow(cfg: DictConfig) -> None:
    """A workflow that runs user code (``workflow=agent``) imports it now."""
    check = getattr(get_registry().get("workflow", cfg.workflow.name).load(), "check_config",
                    None)
    if callable(check):
        check(cfg.workflow)


def check_reward(cfg: DictConfig) -> None:
    """Build the reward as a node will: imports the user's file, finds the function."""
    get_registry().get("reward", cfg.reward.name).create(cfg.reward)


def task_source(cfg: DictConfig) -> Any:
    """The task option's source, its first rows checked (files, keys, prompts)."""
    entry = get_registry().get("task", cfg.task.name)
    conf = OmegaConf.to_container(cfg.task, resolve=True)
    source = entry.create(typed_config(entry.config_cls, conf))
    source.preflight()
    return source


def check_prompts(cfg: DictConfig, source: Any) -> int:
    """The run's tokenizer loads, declares an end token and renders the first prompts;
    the tokens of the longest (what :func:`check_memory` counts a prompt as)."""
    from astraflow.text import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.path).configure(cfg.task)
    first = itertools.chain(itertools.islice(source.train_tasks(), _SAMPLE_PROMPTS),
                            source.eval_tasks()[:_SAMPLE_PROMPTS])
    longest = 0
    for task in first:
        try:
            longest = max(longest, len(tokenizer.encode_prompt(task.prompt)))
        except ValueError as exc:
            raise ConfigError(f"task {task.task_id}: {exc}") from exc
    return longest


def check_memory(cfg: DictConfig, prompt_tokens: int | None = None,
                 machine: tuple[int, str] | None = None, *, evaluated: bool = True) -> Any:
    """The run's estimated peak memory (:func:`astraflow.launch.memory.estimate`: headers
    of the checkpoint, no weights read) against this machine's or its cgroup's: a run
    that cannot fit is refused in one line naming the estimate, the memory there is,
    the biggest component and what lowers it. The estimate, or None when not checked
    (``launcher.memory_check=false``; a Ray cluster the launcher joins, whose machines
    are not known yet). ``machine``: its memory and what sets it
    (:func:`~astraflow.launch.memory.machine_memory`); ``evaluated``: whether the
    evaluators are started (not for a task without a held-out split)."""
    from astraflow.launch import memory

    launcher = cfg.get("launcher") or {}
    if not launcher.get("memory_check", True) or launcher.get("address"):
        return None
    have, where = machine or memory.machine_memory()
    if not have:
        return None
    est = memory.estimate(cfg, prompt_tokens=prompt_tokens, machine=have, evaluated=evaluated)
    if est.bytes <= have:
        return est
    advice = est.biggest().advice
    raise ConfigError(f"this run needs about {memory.gib(est.bytes)} at its peak "
                      f"({est.said()}) but {memory.available(have, where)}; "
                      + (f"{advice}, " if advice else "")
                      + "or set launcher.memory_check=false to start it anyway")
