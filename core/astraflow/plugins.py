"""Plugin discovery and the registry of everything plugins provide.

Environment variables (the pytest conventions):

* ``ASTRAFLOW_PLUGINS`` -- comma-separated allow-list of entry-point names to load.
  The built-ins are always loaded.
* ``ASTRAFLOW_DISABLE_PLUGIN_AUTOLOAD`` -- if set, load no entry points except those
  named in ``ASTRAFLOW_PLUGINS``.
* ``ASTRAFLOW_TRACE_PLUGINS`` -- if set, trace every hook call to stderr.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from astraflow import hookspecs
from astraflow.errors import ConfigError, DuplicateNameError, PluginLoadError, UnknownOptionError

GROUP = "astraflow"
BUILTINS = "builtins"

#: kind -> (hook name, config group, pip distribution prefix for the hint)
KINDS: dict[str, tuple[str, str | None, str]] = {
    "rollout_backend": ("astraflow_register_rollout_backends", "raas", "astraflow-plugin-raas-"),
    "trainer_backend": (
        "astraflow_register_trainer_backends",
        "trainer",
        "astraflow-plugin-trainer-",
    ),
    "task_selector": ("astraflow_register_task_selectors", "data", "astraflow-plugin-data-"),
    "trajectory_filter": (
        "astraflow_register_trajectory_filters",
        "data",
        "astraflow-plugin-data-",
    ),
    "batch_sampler": ("astraflow_register_batch_samplers", "data", "astraflow-plugin-data-"),
    "workflow": ("astraflow_register_workflows", "workflow", "astraflow-plugin-"),
    "task": ("astraflow_register_tasks", "task", "astraflow-plugin-"),
    "reward": ("astraflow_register_rewards", "reward", "astraflow-plugin-"),
    "logger": ("astraflow_register_loggers", "logger", "astraflow-plugin-logger-"),
    # no config group: each policy selects one (policies.<name>.advantage)
    "advantage_estimator": (
        "astraflow_register_advantage_estimators",
        None,
        "astraflow-plugin-advantage-",
    ),
}
#: groups of which a run may select several options (``data=[greso,replay]``): each
#: selected option's settings sit under ``GROUP.NAME``
MULTI_GROUPS = ("data", "logger")
#: config group -> kinds that provide its options
GROUP_KINDS: dict[str, list[str]] = {}
for _kind, (_hook, _group, _pip) in KINDS.items():
    if _group:
        GROUP_KINDS.setdefault(_group, []).append(_kind)


@dataclass
class Entry:
    """One registered implementation."""

    kind: str
    name: str
    factory: str | Callable[..., Any]
    config_cls: type | None
    plugin: str
    distribution: str
    version: str
    description: str = ""
    #: ``"module:function"`` (or the function) judging a config without importing the
    #: implementation: the launcher's pre-flight calls it instead of loading an engine
    #: only to call its ``check_config``
    check: str | Callable[..., Any] | None = None

    def load(self) -> Callable[..., Any]:
        """Import the implementation (only now: registration stays cheap)."""
        return self._resolve(self.factory)

    def checker(self) -> Callable[[Any], None] | None:
        """The config check this entry names, if any; ``check_config`` of the loaded
        implementation is the fallback the caller chooses."""
        return None if self.check is None else self._resolve(self.check)

    def _resolve(self, target: str | Callable[..., Any]) -> Callable[..., Any]:
        if callable(target):
            return target
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginLoadError(
                f"{self.kind} {self.name!r} from {self.distribution} {self.version} "
                f"could not import {module_name!r}: {exc}"
            ) from exc
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj

    def create(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    hooks: list[str] = field(default_factory=list)
    provides: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "hooks": self.hooks,
            "provides": self.provides,
        }
        if self.error:
            out["error"] = self.error
        return out


class Registry:
    """Everything the loaded plugins registered, by kind and name."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self.plugins: dict[str, PluginInfo] = {}

    def add(self, entry: Entry) -> None:
        kind_entries = self.entries[entry.kind]
        # data options share one config group, so their names must be unique across kinds
        group = KINDS[entry.kind][1]
        for other_kind in GROUP_KINDS.get(group, [entry.kind]) if group else [entry.kind]:
            existing = self.entries[other_kind].get(entry.name)
            if existing is not None:
                raise DuplicateNameError(
                    f"{entry.kind} {entry.name!r} is registered twice: by plugin "
                    f"{existing.plugin!r} ({existing.distribution} {existing.version}) and by "
                    f"plugin {entry.plugin!r} ({entry.distribution} {entry.version})"
                )
        kind_entries[entry.name] = entry
        info = self.plugins[entry.plugin]
        label = group or entry.kind
        info.provides.setdefault(label, []).append(entry.name)

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def group_options(self, group: str) -> dict[str, Entry]:
        out: dict[str, Entry] = {}
        for kind in GROUP_KINDS.get(group, []):
            out.update(self.entries[kind])
        return out

    def get(self, kind: str, name: str) -> Entry:
        try:
            return self.entries[kind][name]
        except KeyError:
            raise UnknownOptionError(missing_option_message(self, kind, name)) from None


def missing_option_message(registry: Registry, kind: str, name: str,
                           key: str | None = None) -> str:
    """``name`` is no installed option of ``kind``, in one line naming the installed
    ones, the nearest of them and the ``pip install`` that adds it. ``key``: the setting
    that selects it, for a kind without a config group (``policies.policy.advantage``)."""
    group = KINDS[kind][1]
    installed = ", ".join(
        sorted(registry.group_options(group) if group else registry.entries[kind])
    )
    selector = group or key
    label = f"{selector}={name}" if selector else f"{kind} {name!r}"
    dist = KINDS[kind][2] + name.replace("_", "-")
    import difflib

    near = difflib.get_close_matches(name, installed.split(", "), n=1, cutoff=0.75)
    return (
        f"{label} is not installed. Installed options: {installed or '(none)'}. "
        + (f"Did you mean {selector or kind}={near[0]}? " if near else "")
        + f"To add it: pip install {dist}"
    )


def _dist_of(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown", "unknown"
    return dist.metadata["Name"], dist.version


class AstraFlowPluginManager(pluggy.PluginManager):
    """pluggy's manager plus the bookkeeping ``astraflow plugins`` reports."""

    def __init__(self) -> None:
        super().__init__(GROUP)
        self.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}

    def load_entrypoints(self) -> None:
        allow = {n.strip() for n in os.environ.get("ASTRAFLOW_PLUGINS", "").split(",") if n.strip()}
        autoload = not os.environ.get("ASTRAFLOW_DISABLE_PLUGIN_AUTOLOAD")
        seen: set[str] = set()
        for ep in metadata.entry_points(group=GROUP):
            if ep.name in seen:
                continue
            seen.add(ep.name)
            if ep.name != BUILTINS and (allow or not autoload) and ep.name not in allow:
                continue
            dist, version = _dist_of(ep)
            info = PluginInfo(ep.name, dist, version)
            self.infos[ep.name] = info
            try:
                module = ep.load()
                self.register(module, name=ep.name)
            except Exception as exc:  # one broken plugin must not take the host down
                info.error = f"{type(exc).__name__}: {exc}"
                print(
                    f"astraflow: plugin {ep.name!r} ({dist} {version}) failed to load: "
                    f"{info.error}",
                    file=sys.stderr,
                )
                if os.environ.get("ASTRAFLOW_TRACE_PLUGINS"):
                    traceback.print_exc()
                continue
            info.hooks = sorted(
                h.name for h in (self.get_hookcallers(module) or []) if h.name.startswith(GROUP)
            )

    def build_registry(self) -> Registry:
        registry = Registry()
        registry.plugins = self.infos
        for kind, (hook_name, _group, _pip) in KINDS.items():
            hook = getattr(self.hook, hook_name)
            impls = hook.get_hookimpls()
            for impl in impls:
                plugin_name = self.get_name(impl.plugin) or "?"
                others = [i.plugin for i in impls if i.plugin is not impl.plugin]
                caller = self.subset_hook_caller(hook_name, remove_plugins=others)
                info = self.infos.setdefault(plugin_name, PluginInfo(plugin_name, "?", "?"))

                def register(
                    name, factory, config_cls=None, *, description="", check=None, _kind=kind,
                    _info=info,
                ):
                    registry.add(
                        Entry(
                            _kind,
                            name,
                            factory,
                            config_cls,
                            _info.name,
                            _info.distribution,
                            _info.version,
                            description,
                            check,
                        )
                    )

                try:
                    caller(register=register)
                except DuplicateNameError:
                    raise
                except Exception as exc:
                    info.error = f"{hook_name} failed: {type(exc).__name__}: {exc}"
                    print(
                        f"astraflow: plugin {plugin_name!r} ({info.distribution} "
                        f"{info.version}): {info.error}",
                        file=sys.stderr,
                    )
        return registry


_REGISTRY: Registry | None = None


def get_plugin_manager() -> AstraFlowPluginManager:
    pm = AstraFlowPluginManager()
    if os.environ.get("ASTRAFLOW_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(str(msg)))
        pm.enable_tracing()
    pm.load_entrypoints()
    while True:
        try:
            pm.check_pending()
            break
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or "?"
            info = pm.infos.get(name)
            detail = f"{type(exc).__name__}: {exc}"
            if info:
                info.error = detail
            print(f"astraflow: plugin {name!r} was unloaded: {detail}", file=sys.stderr)
            pm.unregister(exc.plugin)
    return pm


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, built once from the installed plugins."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = get_plugin_manager().build_registry()
    return _REGISTRY


def typed_config(config_cls: type | None, conf: Any) -> Any:
    """An option's config as its registered dataclass (unknown keys are errors)."""
    if config_cls is None or not dataclasses.is_dataclass(config_cls):
        return conf
    if conf is None:
        return config_cls()
    if isinstance(conf, dict):
        try:
            return config_cls(**conf)
        except TypeError as exc:
            raise ConfigError(f"{config_cls.__name__}: {exc}") from None
    return conf
