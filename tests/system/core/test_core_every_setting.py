"""Every setting of the root schema and of every installed option refuses a value it
cannot take, before anything starts, in one line that names it.

The walk builds the refused value from what the setting declares (``config.setting``): one
below ``ge``, ``gt`` itself, one above ``le``, a name not among ``choices``; a setting that
declares no range gets a value of the wrong type (``abc`` for a number, ``flase`` for a
bool, ``[abc]`` for a list of numbers, ``{x: abc}`` for a map of them). A numeric
setting that declares no range fails here with its name: a new one says what it
accepts, or is listed in ``UNBOUNDED``; text without choices is listed in ``SKIPPED``.

Each option is composed once; a value of the right type is set on a copy of its config
and judged by ``validate``, as composing judges it (0.02 s against a compose's 0.1-0.3 s),
and a value of the wrong type is composed, as Hydra refuses it. A few refusals run the
command a user types: exit code 2, one line, no run directory.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from astraflow.cli import config_error
from astraflow.config import compose_config, validate
from astraflow.errors import AstraFlowError, ConfigError
from astraflow.launcher_options import LAUNCHERS
from astraflow.plugins import GROUP_KINDS, MULTI_GROUPS, get_registry
from astraflow.schema import AstraFlowConfig, _unoptional

#: numeric settings that declare no range, and why (``None`` when they should)
UNBOUNDED = {
    # a mean reward, on the scale of whatever reward the run uses
    "data.greso.easy_threshold": "a reward level: rewards have no fixed scale",
}

#: settings the walk has no wrong value for: text without choices (paths, names, URLs,
#: keys into rows), and the untyped ones (``Any``: a list or a name)
SKIPPED = {
    # an estimator's name is checked against the installed ones, not declared choices
    # (tests/system/core/test_core_advantage_plugin.py)
    "": ["run_dir", "policies.policy.advantage", "model.path", "dataflow.host",
         "dataflow.store"],
    "raas=hf": ["raas.name", "raas.device"],
    "raas=sim": ["raas.name"],
    "raas=vllm": ["raas.name", "raas.cpu_threads_bind"],
    "raas=sglang": ["raas.name", "raas.url", "raas.host", "raas.server_module",
                    "raas.server_args", "raas.log_dir"],
    "trainer=hf": ["trainer.name", "trainer.lora.target_modules", "trainer.device"],
    "trainer=megatron": ["trainer.name", "trainer.lora.target_modules"],
    "data=[greso]": ["data.greso.name", "data.greso.policy"],
    "data=[dynamic_sampling]": ["data.dynamic_sampling.name"],
    "data=[replay]": ["data.replay.name"],
    "workflow=single_turn": ["workflow.name"],
    "workflow=tool_use": ["workflow.name"],
    "workflow=solve_verify": ["workflow.name"],
    "workflow=solve_select": ["workflow.name"],
    "workflow=solve_testgen": ["workflow.name"],
    "workflow=agent": ["workflow.name", "workflow.path", "workflow.function",
                       "workflow.command", "workflow.models", "workflow.host",
                       "workflow.advertise_host"],
    "task=arithmetic": ["task.name"],
    "task=functions": ["task.name"],
    "task=subset_sum": ["task.name"],
    **{f"task={name}": ["task.name", "task.train_files", "task.eval_files", "task.prompt_key",
                        "task.answer_key", "task.id_key", "task.task_type_key",
                        "task.system_prompt", "task.tokenizer"]
       for name in ("jsonl", "parquet", "verl")},
    "task=hf_dataset": ["task.name", "task.train_files", "task.eval_files", "task.prompt_key",
                        "task.answer_key", "task.id_key", "task.task_type_key",
                        "task.system_prompt", "task.tokenizer", "task.split",
                        "task.eval_split"],
    "reward=exact_match": ["reward.name"],
    "reward=math": ["reward.name"],
    "reward=regex": ["reward.name", "reward.pattern", "reward.flags"],
    "reward=python": ["reward.name", "reward.path", "reward.function"],
    "reward=code": ["reward.name"],
    "reward=subset_sum": ["reward.name"],
    "logger=[tensorboard]": ["logger.tensorboard.dir"],
    "logger=[mlflow]": ["logger.mlflow.tracking_uri", "logger.mlflow.experiment",
                        "logger.mlflow.run_name"],
    "logger=[wandb]": ["logger.wandb.project", "logger.wandb.entity", "logger.wandb.name",
                       "logger.wandb.tags", "logger.wandb.dir"],
    "launcher=local": ["launcher.preload_modules"],
    # pools and resource maps are checked by RayLauncherConfig.relations (see the tests
    # of a mistyped launcher setting in tests/system/e2e/test_e2e_bad_setup.py)
    "launcher=ray": ["launcher.address", "launcher.local_resources", "launcher.work_dir",
                     "launcher.pools", "launcher.trainer.resources",
                     "launcher.evaluator.resources", "launcher.dataflow.resources"],
}

NUMBERS = (int, float)


def options() -> list[tuple[str, type, str]]:
    """``(selection, schema, key prefix)``: the root, then every installed option."""
    registry = get_registry()
    out = [("", AstraFlowConfig, "")]
    for group, kinds in GROUP_KINDS.items():
        for kind in kinds:
            for name, entry in sorted(registry.entries[kind].items()):
                if entry.config_cls is None:
                    continue
                multi = group in MULTI_GROUPS
                out.append((f"{group}=[{name}]" if multi else f"{group}={name}",
                            entry.config_cls, f"{group}.{name}." if multi else f"{group}."))
    out += [(f"launcher={name}", schema, "launcher.") for name, schema in LAUNCHERS.items()]
    return out


def leaves(node: DictConfig, schema: type, prefix: str):
    """``(key, type, limits)`` of every setting under ``schema``, nested ones included;
    the root's group sections (``raas``, ``data``...) are the options' own."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint, key = _unoptional(hints[f.name]), f"{prefix}{f.name}"
        if schema is AstraFlowConfig and f.name in (*GROUP_KINDS, "launcher"):
            continue
        if dataclasses.is_dataclass(hint):
            yield from leaves(node[f.name], hint, f"{key}.")
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(
                typing.get_args(hint)[1]):
            for name in node[f.name]:
                yield from leaves(node[f.name][name], typing.get_args(hint)[1],
                                  f"{key}.{name}.")
        else:
            yield key, hint, f.metadata.get("astraflow") or {}


def numeric(hint: Any) -> bool:
    args = typing.get_args(hint)
    return hint in NUMBERS or (typing.get_origin(hint) is list and bool(args)
                               and _unoptional(args[0]) in NUMBERS)


def out_of_range(hint: Any, limits: dict[str, Any]) -> list[Any]:
    """Values the declared limits refuse, below and above the range (a list of one for a
    list setting); none for a setting that declares no limits."""
    item = _unoptional(typing.get_args(hint)[0]) if typing.get_origin(hint) is list else hint
    values: list[Any] = []
    if "choices" in limits:
        values.append("not_" + "_".join(str(c) for c in limits["choices"]))
    if "ge" in limits:
        values.append(limits["ge"] - 1)
    elif "gt" in limits:
        values.append(limits["gt"])
    if "le" in limits:
        values.append(limits["le"] + 1)
    elif "lt" in limits:
        values.append(limits["lt"])
    values = [int(v) if item is int else float(v) if item is float else v for v in values]
    return [[v] if item is not hint else v for v in values]


def mistyped(hint: Any) -> str | None:
    """A value of the wrong type for a setting without limits, as the command line spells
    it, or None to skip the setting."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "flase"
    if hint in NUMBERS:
        return "abc"
    if origin is list and args and _unoptional(args[0]) in NUMBERS:
        return "[abc]"
    if origin is dict and args and _unoptional(args[1]) in NUMBERS:
        return "{x: abc}"
    return None


def said(overrides: list[str]) -> str:
    """The line the console prints for a refused composition (without its prefix)."""
    try:
        compose_config(overrides)
    except AstraFlowError as exc:
        return str(exc)
    except (HydraException, OmegaConfBaseException) as exc:
        return config_error(exc, overrides)
    raise AssertionError(f"{overrides} was accepted")


def _section(cfg: DictConfig, prefix: str) -> DictConfig:
    node = cfg
    for part in prefix.rstrip(".").split("."):
        node = node[part]
    return node


#: each option's composed config, composed once
COMPOSED: dict[str, DictConfig] = {}


def cases() -> tuple[list[tuple[str, str, Any]], list[tuple[str, str, str]],
                     dict[str, list[str]], list[str]]:
    """``(selection, key, refused value)`` of every setting that declares limits, and of
    every other one (a mistyped value, composed); what was skipped, per option; the
    numeric settings without a range."""
    bounded, typed, skipped, unbounded = [], [], {}, []
    for selection, schema, prefix in options():
        cfg = COMPOSED[selection] = compose_config([selection] if selection else [])
        for key, hint, limits in leaves(_section(cfg, prefix) if prefix else cfg, schema,
                                        prefix):
            if numeric(hint) and not any(k in limits for k in ("ge", "gt", "le", "lt")):
                unbounded.append(key)
            if bad_values := out_of_range(hint, limits):
                bounded += [(selection, key, bad) for bad in bad_values]
            elif (bad := mistyped(hint)) is not None:
                typed.append((selection, key, bad))
            else:
                skipped.setdefault(selection, []).append(key)
    return bounded, typed, skipped, unbounded


BOUNDED, TYPED, SKIPPED_FOUND, UNBOUNDED_FOUND = cases()

#: refused values that pass today, each with what lets them through
KNOWN_GAPS: dict[tuple[str, str], str] = {}


def test_every_numeric_setting_declares_its_range():
    new = sorted(set(UNBOUNDED_FOUND) - set(UNBOUNDED))
    assert not new, ("numeric settings without ge/gt/le: declare what they accept with "
                     f"config.setting(...), or list them in UNBOUNDED saying why: {new}")
    stale = sorted(set(UNBOUNDED) - set(UNBOUNDED_FOUND))
    assert not stale, f"these declare a range now: take them out of UNBOUNDED: {stale}"


def test_what_the_walk_skips_is_listed():
    """Text without choices and untyped settings: nothing to refuse by declaration. A new
    one is listed in SKIPPED on purpose, or given choices."""
    assert SKIPPED_FOUND == SKIPPED


def test_every_option_is_walked():
    walked = {selection for selection, _, _ in BOUNDED + TYPED} | set(SKIPPED_FOUND)
    assert walked == {selection for selection, _, _ in options()}
    assert len(BOUNDED) > 200 and len(TYPED) > 20  # a walk that found little walked nothing


def _marks(selection: str, key: str) -> list[Any]:
    gap = KNOWN_GAPS.get((selection, key))
    return [pytest.mark.xfail(reason=gap, strict=True)] if gap else []


@pytest.mark.parametrize(("selection", "key", "bad"), [
    pytest.param(s, k, b, id=f"{s or 'root'}:{k}={b}", marks=_marks(s, k))
    for s, k, b in BOUNDED])
def test_a_value_out_of_range_is_named_in_one_line(selection, key, bad):
    cfg = copy.deepcopy(COMPOSED[selection])
    OmegaConf.update(cfg, key, bad, merge=False)
    with pytest.raises(ConfigError) as info:
        validate(cfg, get_registry())
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"{key}="), line


@pytest.mark.parametrize(("selection", "key", "bad"), [
    pytest.param(s, k, b, id=f"{s or 'root'}:{k}={b}") for s, k, b in TYPED])
def test_a_value_of_the_wrong_type_is_named_in_one_line(selection, key, bad):
    # a map's new key is appended (+), as Hydra takes it: see the test below
    plus = "+" if bad.startswith("{") else ""
    overrides = [*([selection] if selection else []), f"{plus}{key}={bad}"]
    line = said(overrides)
    assert "\n" not in line and f"{key}={bad}" in line, line


def test_a_map_of_resources_is_taken_whole_from_the_command_line():
    cfg = compose_config(["launcher=ray", "launcher.trainer.resources={region_eu: 1}",
                          "launcher.local_resources={region_eu: 2}"])
    assert cfg.launcher.trainer.resources == {"region_eu": 1.0}
    assert cfg.launcher.local_resources == {"region_eu": 2.0}


#: a few settings from different groups, refused by the command a user types
SAMPLE = [("trainer.lora.dropout=-1.0", "trainer.lora.dropout=-1.0: must be >= 0"),
          ("raas=vllm raas.gpu_memory_utilization=0",
           "raas.gpu_memory_utilization=0.0: must be > 0"),
          ("data=[greso] data.greso.p_max=1.5", "data.greso.p_max=1.5: must be <= 1"),
          ("workflow=tool_use workflow.sandbox.network=vpn",
           "workflow.sandbox.network=vpn: choose auto, namespace or refuse")]


@pytest.mark.parametrize(("overrides", "message"), SAMPLE, ids=[s for s, _ in SAMPLE])
def test_nothing_starts_and_no_run_directory_is_made(tmp_path: Path, overrides, message):
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", f"run_dir={tmp_path / 'run'}",
         "launcher.progress=false", *overrides.split()],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [f"astraflow: error: {message}"]
    assert not (tmp_path / "run").exists()
