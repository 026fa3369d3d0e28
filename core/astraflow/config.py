"""Hydra composition: plugins contribute config options, the user's syntax just works.

``python -m astraflow +raas=vllm +trainer=hf`` and ``raas=vllm`` both select an option.
Groups with a default are kept out of Hydra's primary defaults list and their default
is appended only when the command line names none, so both spellings mean the same.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from astraflow.errors import ConfigError, UnknownOptionError
from astraflow.plugins import (
    GROUP_KINDS,
    MULTI_GROUPS,
    Registry,
    get_registry,
    missing_option_message,
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


def setting(default: Any = dataclasses.MISSING, *, ge: float | None = None,
            gt: float | None = None, le: float | None = None,
            choices: tuple[Any, ...] | None = None, **kwargs: Any) -> Any:
    """A config dataclass field with the values it accepts, checked when the config is
    composed (before anything starts): ``steps: int = setting(600, ge=1)``. ``None`` is
    always accepted where the field's type allows it; ``kwargs`` go to
    :func:`dataclasses.field` (``default_factory``)."""
    limits = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("choices", choices))
              if v is not None}
    return field(default=default, metadata={"astraflow": limits}, **kwargs)


def _value_problem(value: Any, limits: dict[str, Any]) -> str | None:
    if value is None:
        return None
    if "choices" in limits and value not in limits["choices"]:
        return "choose " + " or ".join(str(c) for c in limits["choices"])
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if "ge" in limits and not value >= limits["ge"]:
        return f"must be >= {limits['ge']:g}"
    if "gt" in limits and not value > limits["gt"]:
        return f"must be > {limits['gt']:g}"
    if "le" in limits and not value <= limits["le"]:
        return f"must be <= {limits['le']:g}"
    return None


def _fields(node: Any, schema: type, prefix: str):
    """Every key of ``node`` under the dataclass ``schema``, nested dataclasses and dicts
    of dataclasses included: ``(key path, its dataclass field or None when the schema
    declares no such key, its value)``."""
    if not dataclasses.is_dataclass(schema) or not isinstance(node, DictConfig):
        return
    hints = typing.get_type_hints(schema)
    declared = {f.name: f for f in dataclasses.fields(schema)}
    for key in node:
        path = f"{prefix}{key}"
        if key not in declared:
            yield path, None, None
            continue
        try:
            value = node[key]
        except Exception:  # an interpolation that resolves later: checked there
            continue
        yield path, declared[key], value
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            yield from _fields(value, hint, f"{path}.")
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
            for sub_key, sub in (value.items() if isinstance(value, DictConfig) else ()):
                yield from _fields(sub, typing.get_args(hint)[1], f"{path}.{sub_key}.")


def check_values(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Every value of ``node`` outside what its ``schema``'s :func:`setting` accepts, as
    ``key=value: why``."""
    out = []
    for path, f, value in _fields(node, schema, prefix):
        limits = f.metadata.get("astraflow") if f is not None else None
        if limits and (why := _value_problem(value, limits)):
            out.append(f"{path}={value}: {why}")
    return out


#: every config group (conf/ folders and plugin-provided groups)
GROUPS = ("raas", "trainer", "data", "workflow", "task", "reward", "logger", "launcher",
          "experiment")


@dataclass
class PolicyConfig:
    """Per-policy settings; one trainer and one weight stream per policy."""

    max_staleness: int = 3  # checked by the data layer's settings, with what it means
    lr: float | None = setting(None, gt=0)  # overrides trainer.lr for this policy


@dataclass
class ModelConfig:
    """The model every policy starts from. ``path: null`` builds the tiny local model."""

    path: str | None = None
    hidden_size: int = setting(128, ge=1)
    num_layers: int = setting(2, ge=1)
    num_heads: int = setting(2, ge=1)
    intermediate_size: int = setting(256, ge=1)
    max_position_embeddings: int = setting(256, ge=1)
    warmstart_steps: int = setting(400, ge=0)


@dataclass
class DataflowConfig:
    """Where the data layer listens, and how it leases tasks and buffers trajectories."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port (the launcher names a port it cannot listen on)
    store: str | None = None  # default: <run_dir>/store
    order: str = "fifo"  # fifo | edf (checked by the data layer's settings)
    lease_seconds: float = setting(60.0, gt=0)
    buffer_capacity: int = setting(4096, ge=1)
    heartbeat_timeout: float = setting(30.0, gt=0)
    #: at a run's end, tasks for this many batches beyond the last are issued, so the
    #: last batches take the first groups back, not the slowest (0: exactly the need)
    end_spare_batches: int = setting(1, ge=0)


@dataclass
class AstraFlowConfig:
    """The root schema: unknown top-level keys are errors."""

    seed: int = 0
    mode: str = setting("async", choices=("async", "sync"))  # sync: the trainer-centred baseline
    run_dir: str | None = None
    # the default run: 600 steps of 32 prompts x 8 samples (lr 3e-4, cosine decay) lift
    # held-out accuracy of the warm-started tiny model by ~35 points in ~3-4 minutes on
    # 2 quiet CPU cores
    steps: int = setting(600, ge=1)
    batch_size: int = setting(256, ge=1)
    group_size: int = setting(8, ge=1)
    eval_every: int = setting(50, ge=0)
    eval_samples: int = setting(8, ge=1)  # samples per held-out task for eval_accuracy
    #: the evaluator's CPU niceness (0-19): where it shares CPUs with a trainer or an
    #: engine it takes what they leave, so evaluating does not slow training
    eval_niceness: int = setting(10, ge=0, le=19)
    #: keep a copy of each version due while the policy trains and score them all when
    #: its trainer is done: evaluation takes no compute from the run (benchmarks; no
    #: device to spare), its scores come at the end
    eval_deferred: bool = False
    num_nodes: int = setting(1, ge=0)
    #: let the local launcher start and retire nodes after the data layer's autoscale
    #: report, keeping between min_nodes and max_nodes
    autoscale: bool = False
    min_nodes: int = setting(1, ge=0)
    max_nodes: int = setting(4, ge=1)
    #: most tasks a RaaS node keeps in flight; below it, rate x turnaround (Little's law)
    node_concurrency: int = setting(64, ge=1)
    #: partial rollouts: a node loads new weights under the generations in flight, which
    #: go on with them from their next token (each token keeps the version that sampled
    #: it), instead of waiting for the longest to finish on the old ones (raas=hf, vllm)
    partial_rollouts: bool = False
    #: seconds between a trainer's checkpoints (model and optimiser moments). In between,
    #: each batch it trains on goes to a journal before it is acknowledged, and a
    #: restarted trainer trains the journal's batches again on its last checkpoint, so
    #: none is lost or trained twice; a longer interval costs less and makes a restart
    #: longer. 0: a checkpoint at every step
    checkpoint_interval: float = setting(60.0, ge=0)
    #: a trainer fetches its next batch while it trains on the current one, so a step
    #: does not wait for the fetch; the batch fetched ahead is composed for the version
    #: it will be trained at, so max_staleness holds as without
    fetch_ahead: bool = True
    #: a trainer publishes each step's weights and acknowledges its batch on a thread of
    #: its own while the next step trains (from a snapshot taken when the step ends)
    overlap_publish: bool = True
    #: each trainer appends every batch it trains on to metrics/batches-<policy>.jsonl,
    #: with its step, so a step can be replayed offline (large: for debugging)
    record_batches: bool = False
    policies: dict[str, PolicyConfig] = field(default_factory=lambda: {"policy": PolicyConfig()})
    model: ModelConfig = field(default_factory=ModelConfig)
    dataflow: DataflowConfig = field(default_factory=DataflowConfig)
    raas: Any = None
    trainer: Any = None
    workflow: Any = None
    task: Any = None
    reward: Any = None
    launcher: Any = None
    data: dict[str, Any] = field(default_factory=dict)
    logger: dict[str, Any] = field(default_factory=dict)


def register_configs(registry: Registry) -> None:
    """Put the root schema and every plugin option into Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    cs.store(name="astraflow_schema", node=AstraFlowConfig)
    for group, kinds in GROUP_KINDS.items():
        for kind in kinds:
            for name, entry in registry.entries[kind].items():
                node = OmegaConf.structured(entry.config_cls) if entry.config_cls else {}
                node = OmegaConf.merge(node, {"name": name}) if "name" in node else node
                package = f"{group}.{name}" if group in MULTI_GROUPS else group
                cs.store(
                    group=group, name=name, node=node, package=package, provider=entry.distribution
                )


_GROUP_RE = re.compile(r"^(?P<prefix>[+~]*)(?P<group>[A-Za-z_]+)(?:@[^=]*)?(?:=(?P<value>.*))?$")


def _options(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        return [v.strip() for v in value[1:-1].split(",") if v.strip()]
    return [value] if value else []


def normalise_overrides(overrides: list[str], registry: Registry) -> list[str]:
    """Accept ``group=x`` and ``+group=x`` alike; add defaults for unnamed groups.

    Options of plugin-backed groups are checked here so a missing plugin gets a message
    naming the installed options and the ``pip install`` that adds it.
    """
    out: list[str] = []
    named: set[str] = set()
    for ov in overrides:
        # ``agent.path=...`` is short for ``workflow.path=...`` (workflow=agent)
        ov = re.sub(r"^([+~]*)agent\.", r"\1workflow.", ov)
        # ``model.path=~/models/x`` as the README writes it: the shell expands no ``~``
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
    with initialize_config_module(config_module="astraflow.conf", version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=normalise_overrides(overrides or [], registry)
        )
    validate(cfg, registry)
    return cfg


def validate(cfg: DictConfig, registry: Registry) -> None:
    """Reject keys no schema declares, including ones appended with ``+key=value``, and
    values outside what a schema's :func:`setting` accepts."""
    unknown = _unknown_keys(cfg, AstraFlowConfig, "")
    wrong = check_values(cfg, AstraFlowConfig)
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
                unknown += _unknown_keys(sub, entry.config_cls, prefix)
                wrong += check_values(sub, entry.config_cls, prefix)
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
    if wrong:
        raise ConfigError("; ".join(wrong))


def _unknown_keys(node: Any, schema: type, prefix: str) -> list[str]:
    return [path for path, f, _ in _fields(node, schema, prefix) if f is None]


def group_options(group: str) -> list[str]:
    """Every option of ``group``: plugin-provided and file-based."""
    from importlib import resources

    names: set[str] = set()
    if group in GROUP_KINDS:
        names.update(get_registry().group_options(group))
    folder = resources.files("astraflow.conf") / group
    if folder.is_dir():
        names.update(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(names)
