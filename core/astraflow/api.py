"""The plugin API: every name a plugin may import, subclass or call, and its shape.

What is listed in :data:`PUBLIC` is a promise, versioned with ``astraflow`` itself
(semantic versioning, ``astraflow.__version__``):

* a **patch** release changes no public name;
* a **minor** release may add names, methods, optional parameters and settings with a
  default, and may deprecate (:mod:`astraflow.deprecation`): a deprecated name warns for
  at least one minor release and keeps working until the next major;
* a **major** release alone removes or changes what is listed, with a line in
  ``docs/changelog.md`` saying what a plugin changes.

Everything else under ``astraflow`` (the data layer, the launchers, the node and trainer
runtimes) is internal and changes without notice. ``python -m astraflow.api`` prints the
surface as JSON; ``--write`` records it as the version's snapshot, which
``tests/system/core/test_core_plugin_api.py`` compares each change against.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

#: module -> the names in it that plugins may rely on
PUBLIC: dict[str, tuple[str, ...]] = {
    "astraflow": ("__version__", "hookimpl"),
    "astraflow.hookspecs": (
        "astraflow_register_rollout_backends", "astraflow_register_trainer_backends",
        "astraflow_register_task_selectors", "astraflow_register_trajectory_filters",
        "astraflow_register_batch_samplers", "astraflow_register_workflows",
        "astraflow_register_tasks", "astraflow_register_rewards",
        "astraflow_register_loggers", "astraflow_register_advantage_estimators"),
    "astraflow.contracts": (
        "AdvantageEstimator", "BatchSampler", "DataAlgorithm", "MetricLogger",
        "PolicyHandle", "Reward", "RolloutBackend", "TaskSelector", "TaskSource", "Tokenizer",
        "TrainerBackend", "TrajectoryFilter", "Workflow"),
    "astraflow.types": ("PROMPT", "TOOL", "Task", "Span", "Trajectory", "RewardOutcome",
                        "TrainItem", "Batch", "GenerationRequest", "Generation",
                        "RoutedExperts"),
    "astraflow.routing": ("from_array", "to_array", "extend"),
    "astraflow.errors": ("AstraFlowError", "ConfigError"),
    "astraflow.config": ("setting",),
    "astraflow.deprecation": ("AstraFlowDeprecationWarning", "deprecated"),
    "astraflow.trajectory": ("TrajectoryBuilder", "without_stop"),
    "astraflow.workflows.builder": ("TrajectoryBuilder", "EnvWorkflow", "EnvConfig",
                                    "AttemptsWorkflow", "with_defaults", "without_stop",
                                    "WorkflowConfig"),
    "astraflow.workflows.single_turn": ("SingleTurnWorkflow", "SingleTurnConfig"),
    "astraflow.workflows.latency": ("LatencyConfig",),
    "astraflow.workflows.groups": ("GroupConfig", "first_of", "sizes"),
    "astraflow.rewards.base": ("RewardConfig", "Score"),
    "astraflow.loggers.base": ("scalars",),
    "astraflow.rl.losses": ("token_logprobs", "token_entropy", "PolicyLoss", "policy_loss"),
    "astraflow.rl.advantages": ("group_advantages",),
    "astraflow.rl.options": ("PolicyGradientOptions", "LoraOptions"),
    "astraflow.rl.policy_gradient": ("PolicyGradientBackend",),
    "astraflow.testing": ("wait_until",),
    "astraflow.testing.contracts": (
        "TaskSourceContract", "RewardContract", "TrajectoryFilterContract",
        "TaskSelectorContract", "BatchSamplerContract", "WorkflowContract",
        "LoggerContract", "AdvantageEstimatorContract"),
    "astraflow.testing.rollout": ("RolloutBackendContract",),
    "astraflow.testing.trainer": ("TrainerBackendContract",),
}


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return _plain_names(re.sub(r" object at 0x[0-9a-f]+", "", text))  # no address


def _plain_names(annotation: str) -> str:
    """An annotation without module qualifiers (``shared_prefix.SharedPrefix`` and
    ``SharedPrefix`` are one type to a plugin), so spelling an import otherwise is no
    change of the API."""
    return re.sub(r"\b(?:[a-z_]\w*\.)+(?=[A-Za-z_])", "", annotation)


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("astraflow")


def _owner(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def _class_shape(cls: type) -> dict[str, Any]:
    """A class's public methods and attributes (own and inherited from the public
    bases) and, for a dataclass, its fields with their types and defaults."""
    shape: dict[str, Any] = {"bases": [b.__name__ for b in cls.__mro__[1:-1]]}
    if dataclasses.is_dataclass(cls):
        shape["fields"] = {
            f.name: _plain_names(f"{f.type} = {_default(f)}") for f in dataclasses.fields(cls)}
    members = {}
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if dataclasses.is_dataclass(cls) and name in shape["fields"]:
            continue
        if not _ours(_owner(cls, name)):  # object's, ABC's, Exception's: not ours to keep
            continue
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, staticmethod | classmethod):
            members[name] = f"{type(attr).__name__} {_signature(attr.__func__)}"
        elif inspect.isfunction(attr):
            is_async = inspect.iscoroutinefunction(attr)
            members[name] = ("async " if is_async else "") + _signature(attr)
        elif isinstance(attr, property):
            members[name] = "property"
        elif not callable(attr):
            members[name] = f"attribute {type(attr).__name__}"
    shape["members"] = members
    return shape


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return "factory"
    return "required"


def surface() -> dict[str, dict[str, Any]]:
    """Every public name with its shape: a function's signature, a class's methods and
    fields, a constant's type."""
    out: dict[str, dict[str, Any]] = {}
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        shapes: dict[str, Any] = {}
        for name in names:
            obj = getattr(module, name)
            if not _ours(obj) and not isinstance(obj, str | int | float):
                # another library's object re-exported (pluggy's hookimpl marker)
                shapes[name] = {"type": type(obj).__name__}
            elif inspect.isclass(obj):
                shapes[name] = _class_shape(obj)
            elif callable(obj) and not isinstance(obj, type):
                shapes[name] = {"signature": _signature(obj)}
            else:
                shapes[name] = {"type": type(obj).__name__}
        out[module_name] = shapes
    return out


def snapshot_path(major: int) -> Path:
    """Where the surface of major version ``major`` is recorded."""
    return Path(__file__).with_name(f"api-v{major}.json")


def breaks(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """What a plugin written against ``old`` would find gone or changed in ``new``:
    names, methods, fields and signatures removed or changed (additions break nothing)."""
    out = []
    for module, names in old.items():
        for name, shape in names.items():
            now = new.get(module, {}).get(name)
            where = f"{module}.{name}"
            if now is None:
                out.append(f"{where} is gone")
                continue
            for key in ("signature", "type"):
                if key in shape and shape[key] != now.get(key) and not (
                        key == "signature" and extends(shape[key], now.get(key))):
                    out.append(f"{where}: {key} {shape[key]} is now {now.get(key)}")
            for part in ("fields", "members"):
                for member, was in shape.get(part, {}).items():
                    is_now = now.get(part, {}).get(member)
                    if is_now is None:
                        out.append(f"{where}.{member} is gone")
                    elif is_now != was and not extends(was, is_now):
                        out.append(f"{where}.{member}: {was} is now {is_now}")
    return out


def extends(was: Any, now: Any) -> bool:
    """Whether signature ``now`` is ``was`` with parameters added at its end, each with a
    default (or ``*args``/``**kwargs``): every call written for ``was`` still works."""
    if not (isinstance(was, str) and isinstance(now, str)):
        return False
    (was_params, _, was_returns), (now_params, _, now_returns) = (
        text.rpartition(" -> ") if " -> " in text else (text, "", "") for text in (was, now))
    if was_returns != now_returns or not (was_params.startswith("(")
                                          and now_params.startswith("(")):
        return False
    old, new = was_params[1:-1], now_params[1:-1]
    if not new.startswith(old) or new == old:
        return False
    added = new[len(old):]
    if old:
        if not added.startswith(", "):
            return False
        added = added[2:]
    return all("=" in part or part.startswith("*") for part in added.split(", "))


def main(argv: list[str] | None = None) -> int:
    from astraflow import __version__

    argv = sys.argv[1:] if argv is None else argv
    text = json.dumps(surface(), indent=1, sort_keys=True) + "\n"
    if "--write" in argv:
        path = snapshot_path(int(__version__.split(".")[0]))
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
