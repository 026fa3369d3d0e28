"""Hydra composition: plugins contribute config options, the user's syntax just works.

``python -m astraflow +raas=vllm +trainer=hf`` and ``raas=vllm`` both select an option.
Groups with a default are kept out of Hydra's primary defaults list and their default
is appended only when the command line names none, so both spellings mean the same.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from collections.abc import Sequence
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from astraflow.errors import ConfigError, UnknownOptionError
from astraflow.launcher_options import LAUNCHERS
from astraflow.plugins import (
    GROUP_KINDS,
    MULTI_GROUPS,
    Registry,
    get_registry,
    missing_option_message,
)
from astraflow.schema import (  # noqa: F401  (astraflow.config.setting: the plugin API)
    AstraFlowConfig,
    DataflowConfig,
    ModelConfig,
    PolicyConfig,
    check,
    check_values,
    setting,
)

#: groups whose default is added when the command line names none
DEFAULT_OPTIONS: dict[str, str] = {
    "raas": "hf",
    "trainer": "hf",
    "workflow": "single_turn",
    "task": "arithmetic",
    "reward": "exact_match",
    "logger": "tensorboard",
    "launcher": "local",
}


#: every config group (conf/ folders and plugin-provided groups)
GROUPS = ("raas", "trainer", "data", "workflow", "task", "reward", "logger", "launcher",
          "experiment")


#: the registry whose options are in Hydra's ConfigStore
_STORED: Registry | None = None


def register_configs(registry: Registry) -> None:
    """Put the root schema and every plugin option into Hydra's ConfigStore, once per
    registry: building every option's schema took half of each :func:`compose_config`."""
    global _STORED
    cs = ConfigStore.instance()
    if registry is _STORED and "astraflow_schema.yaml" in cs.repo:
        return
    cs.store(name="astraflow_schema", node=AstraFlowConfig)
    for name, schema in LAUNCHERS.items():
        cs.store(group="launcher", name=name, node=schema, provider="astraflow")
    for group, kinds in GROUP_KINDS.items():
        for kind in kinds:
            for name, entry in registry.entries[kind].items():
                node = OmegaConf.structured(entry.config_cls) if entry.config_cls else {}
                node = OmegaConf.merge(node, {"name": name}) if "name" in node else node
                package = f"{group}.{name}" if group in MULTI_GROUPS else group
                cs.store(
                    group=group, name=name, node=node, package=package, provider=entry.distribution
                )
    _STORED = registry


_GROUP_RE = re.compile(r"^(?P<prefix>[+~]*)(?P<group>[A-Za-z_]+)(?:@[^=]*)?(?:=(?P<value>.*))?$")


def _options(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        return [v.strip() for v in value[1:-1].split(",") if v.strip()]
    return [value] if value else []


#: ``agent.path=...`` is short for ``workflow.path=...`` (workflow=agent)
_AGENT = re.compile(r"^([+~]*)agent\.")


def normalise_overrides(overrides: list[str], registry: Registry) -> list[str]:
    """Accept ``group=x`` and ``+group=x`` alike; add defaults for unnamed groups.

    Options of plugin-backed groups are checked here so a missing plugin gets a message
    naming the installed options and the ``pip install`` that adds it.
    """
    out: list[str] = []
    named: set[str] = set()
    for ov in overrides:
        ov = _AGENT.sub(r"\1workflow.", ov)
        # ``model.path=~/models/x`` as the docs write it: the shell expands no ``~``
        # after ``=`` in an argument and Hydra's grammar refuses one, so it is expanded
        # here, to the home directory the user meant
        ov = re.sub(r"^([^=~]+=)~(?=/|$)", lambda m: m[1] + os.path.expanduser("~"), ov)
        m = _GROUP_RE.match(ov)
        if not m or m["group"] not in GROUPS:
            out.append(ov)
            continue
        group, prefix, value = m["group"], m["prefix"], m["value"]
        named.add(group)
        if "~" in prefix:
            out.append(ov)
            continue
        if value is None:
            raise UnknownOptionError(
                f"{ov!r}: say which option, e.g. {group}={DEFAULT_OPTIONS.get(group, 'NAME')}"
            )
        kinds = GROUP_KINDS.get(group)
        if kinds:
            available = registry.group_options(group)
            for option in _options(value):
                if option not in available:
                    raise UnknownOptionError(missing_option_message(registry, kinds[0], option))
        out.append(f"+{group}={value}" if not prefix else ov)
    for group, default in DEFAULT_OPTIONS.items():
        if group not in named:
            out.append(f"+{group}={default}")
    out = [_one_path_as_list(ov, out, registry) for ov in out]
    # an experiment sets values inside other groups (trainer.lr, trainer.lora...): it is
    # merged after every group's option, or the option's defaults would replace them
    experiments = [ov for ov in out if (m := _GROUP_RE.match(ov)) and m["group"] == "experiment"]
    return [ov for ov in out if ov not in experiments] + experiments


_SETTING_RE = re.compile(r"^(?P<key>[A-Za-z_][\w.]*)=(?P<value>[^\[].*)$")


def _one_path_as_list(ov: str, overrides: list[str], registry: Registry) -> str:
    """``task.train_files=data/train.jsonl``: one value where the option's config takes a
    list (of paths) is that one-item list, as verl and most tools accept it."""
    m = _SETTING_RE.match(ov)
    if not m or "." not in m["key"]:
        return ov
    group, *path = m["key"].split(".")
    kinds = GROUP_KINDS.get(group)
    if not kinds or group in MULTI_GROUPS:
        return ov
    chosen = [g["value"] for o in overrides
              if (g := _GROUP_RE.match(o)) and g["group"] == group and g["value"]]
    if not chosen:
        return ov
    entry = registry.group_options(group).get(chosen[-1])
    schema = entry.config_cls if entry is not None else None
    for i, name in enumerate(path):
        if not dataclasses.is_dataclass(schema):
            return ov
        hint = typing.get_type_hints(schema).get(name)
        if i == len(path) - 1:
            if typing.get_origin(hint) is list and not m["value"].startswith(("null", "${")):
                return f"{m['key']}=[{m['value']}]"
            return ov
        schema = hint
    return ov


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the run config from the installed plugins, ``conf/`` and ``overrides``."""
    registry = get_registry()
    register_configs(registry)
    overrides, per_policy = _policy_overrides(overrides or [])
    with initialize_config_module(config_module="astraflow.conf", version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=normalise_overrides(overrides, registry)
        )
    # the template first: a role set here starts from it, as a role not set at all does
    for key, value in sorted(per_policy, key=lambda kv: kv[0].split(".")[1] != "policy"):
        _set_policy(cfg, key, value)
    validate(cfg, registry)
    return cfg


_POLICY_RE = re.compile(r"^\+{0,2}policies\.[^.=]+\.[^=]+=")


def _policy_overrides(overrides: list[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """``policies.verifier.lr=1e-3``, with or without ``+``, as (key, value) pairs: a
    role other than ``policy`` is no key of the composed map yet, which Hydra refuses
    to set (and a typed map refuses a plain one), so they are merged after composing."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rest, per_policy = [], []
    for ov in overrides:
        if not _POLICY_RE.match(ov):
            rest.append(ov)
            continue
        try:
            (parsed,) = OverridesParser.create().parse_overrides([ov])
        except Exception as exc:  # Hydra's grammar error, in one line
            raise ConfigError(f"{ov!r}: {str(exc).splitlines()[0]}") from None
        per_policy.append((parsed.key_or_group, parsed.value()))
    return rest, per_policy


def _set_policy(cfg: DictConfig, key: str, value: Any) -> None:
    from omegaconf import open_dict
    from omegaconf.errors import ConfigKeyError, ValidationError

    _, name, *path = key.split(".")
    nested: Any = value
    for part in reversed(path):
        nested = {part: nested}
    template = cfg.policies.get("policy")
    try:
        with open_dict(cfg):
            if name not in cfg.policies and template is not None:
                cfg.merge_with({"policies": {name: OmegaConf.to_container(template)}})
            cfg.merge_with({"policies": {name: nested}})
    except ConfigKeyError:
        names = [f.name for f in dataclasses.fields(PolicyConfig)]
        near = difflib.get_close_matches(path[0], names, n=1)
        raise ConfigError(f"{key} is not a setting; policies.{name} has: {', '.join(names)}"
                          + (f" (did you mean {near[0]}?)" if near else "")) from None
    except ValidationError as exc:
        # what the setting means, as a value out of its range is told
        field = next((f for f in dataclasses.fields(PolicyConfig) if path[-1:] == [f.name]),
                     None)
        why = field.metadata.get("astraflow", {}).get("why") if field is not None else None
        raise ConfigError(f"{key}={value}: {str(exc).splitlines()[0]}"
                          + (f" ({why})" if why else "")) from None


def validate(cfg: DictConfig, registry: Registry) -> None:
    """Reject keys no schema declares, including ones appended with ``+key=value``, and
    values outside what a schema's :func:`setting` accepts."""
    checks: list[tuple[Any, type, str]] = [(cfg, AstraFlowConfig, "")]
    wrong = []
    for group, kinds in GROUP_KINDS.items():
        node = cfg.get(group)
        if node is None:
            continue
        options = registry.group_options(group)
        chosen = node.items() if group in MULTI_GROUPS else [(node.get("name"), node)]
        for name, sub in chosen:
            entry = options.get(name)
            if entry is None:
                raise ConfigError(missing_option_message(registry, kinds[0], str(name)))
            if entry.config_cls is not None:
                prefix = f"{group}.{name}." if group in MULTI_GROUPS else f"{group}."
                checks.append((sub, entry.config_cls, prefix))
    launcher = cfg.get("launcher")
    if launcher is not None and launcher.get("kind") not in LAUNCHERS:
        wrong.append(f"launcher.kind={launcher.get('kind')}: choose "
                     + " or ".join(LAUNCHERS))
    elif launcher is not None:
        checks.append((launcher, LAUNCHERS[launcher.kind], "launcher."))
    unknown = []
    for node, schema, prefix in checks:
        keys, problems = check(node, schema, prefix)
        unknown += keys
        wrong += problems
    wrong += _unknown_estimators(cfg, registry)
    if unknown:
        raise ConfigError("; ".join(unknown_key_message(cfg, key) for key in unknown))
    if wrong:
        raise ConfigError("; ".join(wrong))


def _unknown_estimators(cfg: DictConfig, registry: Registry) -> list[str]:
    """A policy's ``advantage`` that no installed plugin registers, as the line that
    names the installed estimators and the ``pip install`` that adds it."""
    out = []
    for policy, settings in (cfg.get("policies") or {}).items():
        name = settings.get("advantage") if isinstance(settings, DictConfig) else None
        if name is not None and name not in registry.entries["advantage_estimator"]:
            out.append(missing_option_message(registry, "advantage_estimator", str(name),
                                              key=f"policies.{policy}.advantage"))
    return out


def unknown_key_message(cfg: DictConfig, key: str, overrides: Sequence[str] = ()) -> str:
    """``key`` is no setting of ``cfg``, in one line with the nearest setting there is:
    the top level's nearest names, or a section's settings and the nearest of them. A
    ``workflow.X`` that ``overrides`` set as ``agent.X`` is named as typed."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    names = sorted(str(k) for k in node if str(k) != leaf) if isinstance(node, DictConfig) else []
    shown, section = key, parent
    typed = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    if parent == "workflow" and f"agent.{leaf}" in typed:
        shown, section = f"agent.{leaf}", "agent"
        if cfg.workflow.get("name") != "agent":
            return (f"{shown} is not a setting of this run: agent.* is short for "
                    f"workflow.* when workflow=agent, and this run's workflow is "
                    f"{cfg.workflow.get('name')}")
    if not parent:
        near = difflib.get_close_matches(leaf, names, n=3)
        return f"{key} is not a setting" + (f"; did you mean {', '.join(near)}?" if near else "")
    near = difflib.get_close_matches(leaf, names, n=1)
    if not near:  # a run-wide setting put in a section (trainer.checkpoint_interval)
        top = [str(k) for k in cfg if not isinstance(cfg.get(k), DictConfig | ListConfig)]
        near = [f"{n}, a top-level setting" for n in difflib.get_close_matches(leaf, top, n=1)]
    return (f"{shown} is not a setting; {section} has: {', '.join(names)}"
            + (f" (did you mean {near[0]}?)" if near else ""))


def group_options(group: str) -> list[str]:
    """Every option of ``group``: plugin-provided and file-based."""
    from importlib import resources

    names: set[str] = set()
    if group in GROUP_KINDS:
        names.update(get_registry().group_options(group))
    if group == "launcher":
        names.update(LAUNCHERS)
    folder = resources.files("astraflow.conf") / group
    if folder.is_dir():
        names.update(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(names)
