"""The run config's schema and the checks its settings declare.

Every config group's settings are dataclasses; :func:`setting` declares a field with the
values it accepts, and :func:`check_values` finds a value outside them. Free of Hydra, so
the data layer derives its own settings from these without importing it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig


def setting(default: Any = dataclasses.MISSING, *, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None,
            choices: tuple[Any, ...] | None = None, why: str | None = None,
            **kwargs: Any) -> Any:
    """A config dataclass field with the values it accepts, checked when the config is
    composed (before anything starts): ``steps: int = setting(600, ge=1)``. ``None`` is
    always accepted where the field's type allows it; a list's items are checked one by
    one; ``why`` ends the message of a value refused (what the setting means);
    ``kwargs`` go to :func:`dataclasses.field` (``default_factory``)."""
    limits = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt),
                                ("choices", choices), ("why", why)) if v is not None}
    if default is not dataclasses.MISSING:
        kwargs["default"] = default
    return field(metadata={"astraflow": limits}, **kwargs)


def like(source: dataclasses.Field, default: Any = dataclasses.MISSING) -> Any:
    """A field with the default and the limits of ``source``, a field of another
    schema: settings that a component takes from the run config (the data layer's)
    keep one default and one range. ``default``: the same setting, defaulting to
    another value (a workflow that answers in fewer tokens than most)."""
    if default is not dataclasses.MISSING:
        return field(default=default, metadata=source.metadata)
    if source.default_factory is not dataclasses.MISSING:
        return field(default_factory=source.default_factory, metadata=source.metadata)
    return field(default=source.default, metadata=source.metadata)


def _value_problem(value: Any, limits: dict[str, Any]) -> str | None:
    problem = _bare_problem(value, limits)
    return f"{problem} ({limits['why']})" if problem and "why" in limits else problem


def _bare_problem(value: Any, limits: dict[str, Any]) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple | ListConfig):
        return next((p for item in value if (p := _bare_problem(item, limits))), None)
    if "choices" in limits and value not in limits["choices"]:
        *rest, last = (str(c) for c in limits["choices"])
        return "choose " + (f"{', '.join(rest)} or {last}" if rest else last)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if "ge" in limits and not value >= limits["ge"]:
        return f"must be >= {limits['ge']:g}"
    if "gt" in limits and not value > limits["gt"]:
        return f"must be > {limits['gt']:g}"
    if "le" in limits and not value <= limits["le"]:
        return f"must be <= {limits['le']:g}"
    if "lt" in limits and not value < limits["lt"]:
        return f"must be < {limits['lt']:g}"
    return None


def _fields(node: Any, schema: type, prefix: str):
    """Every key of ``node`` under the dataclass ``schema``, nested dataclasses and dicts
    of dataclasses included: ``(key path, its dataclass field or None when the schema
    declares no such key, its value)``."""
    if not dataclasses.is_dataclass(schema) or not isinstance(node, DictConfig):
        return
    hints = typing.get_type_hints(schema)
    declared = {f.name: f for f in dataclasses.fields(schema)}
    for key in map(str, node):
        path = f"{prefix}{key}"
        if key not in declared:
            yield path, None, None
            continue
        try:
            value = node[key]
        except Exception:  # an interpolation that resolves later: checked there
            continue
        yield path, declared[key], value
        hint = _unoptional(hints[key])
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            yield from _fields(value, hint, f"{path}.")
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
            for sub_key, sub in (value.items() if isinstance(value, DictConfig) else ()):
                yield from _fields(sub, typing.get_args(hint)[1], f"{path}.{sub_key!s}.")


def _unoptional(hint: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def value_problem(path: str, value: Any, f: dataclasses.Field | None) -> str | None:
    """``path=value: why`` when the :func:`setting` ``f`` refuses ``value``, else None."""
    limits = f.metadata.get("astraflow") if f is not None else None
    why = _value_problem(value, limits) if limits else None
    return f"{path}={value}: {why}" if why else None


def check(node: Any, schema: type, prefix: str = "") -> tuple[list[str], list[str]]:
    """One walk over ``node`` under ``schema``: the keys it does not declare, and the
    values its settings refuse or, when every value is in range, what its
    ``relations`` refuse."""
    unknown, wrong = [], []
    for path, f, value in _fields(node, schema, prefix):
        if f is None:
            unknown.append(path)
        elif problem := value_problem(path, value, f):
            wrong.append(problem)
    return unknown, wrong or check_relations(node, schema)


def check_values(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Every value of ``node`` outside what its ``schema``'s :func:`setting` accepts, as
    ``key=value: why``."""
    return [problem for path, f, value in _fields(node, schema, prefix)
            if (problem := value_problem(path, value, f))]


def check_relations(node: Any, schema: type) -> list[str]:
    """What ``schema.relations(node)`` finds wrong between settings (``batch_size`` and
    ``group_size``): a schema declares relations as a static method taking its node."""
    relations = getattr(schema, "relations", None)
    return list(relations(node)) if callable(relations) else []


def check_instance(obj: Any, prefix: str = "") -> list[str]:
    """:func:`check_values` for a dataclass instance (settings built in code, not
    composed)."""
    return [problem for f in dataclasses.fields(obj)
            if (problem := value_problem(f"{prefix}{f.name}", getattr(obj, f.name), f))]


@dataclass
class PolicyConfig:
    """Per-policy settings; one trainer and one weight stream per policy."""

    #: versions a sample may lag the weights it is trained on; null: 3, widened by the
    #: trainer steps the slow groups take beyond a typical one, at most 16
    #: (astraflow.dataflow.versions); /v1/status shows the bound and why
    max_staleness: int | None = setting(None, ge=0, why="versions a sample may lag the "
                                        "weights it is trained on; null, the default: "
                                        "derived from the measured turnaround")
    lr: float | None = setting(None, gt=0)  # overrides trainer.lr for this policy
    #: ranks of this policy's trainer (overrides trainer.world_size): a large policy on
    #: several ranks beside a small one on one
    world_size: int | None = setting(None, ge=1)
    #: the advantage estimator: grpo, dr_grpo, rloo, reinforce_pp or one a plugin
    #: registers (astraflow_register_advantage_estimators); checked against the
    #: installed ones as the config is composed
    advantage: str = "grpo"


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
    #: 0 picks a free port (the launcher names a port it cannot listen on)
    port: int = setting(0, ge=0, le=65535)
    store: str | None = None  # default: <run_dir>/store
    #: the order tasks are leased in: fifo, or edf (earliest deadline first)
    order: str = setting("fifo", choices=("fifo", "edf"))
    lease_seconds: float = setting(60.0, gt=0)
    buffer_capacity: int = setting(4096, ge=1)
    heartbeat_timeout: float = setting(30.0, gt=0)
    #: at a run's end, tasks for this many batches beyond the last are issued, so the
    #: last batches take the first groups back, not the slowest (0: exactly the need)
    end_spare_batches: int = setting(1, ge=0)
    #: seconds a done task, an acknowledged batch and a departed rollout node are
    #: remembered (a late duplicate of one is answered "duplicate"); then they are
    #: dropped from memory and the store, so a run of days keeps both bounded
    retain_seconds: float = setting(3600.0, gt=0)


@dataclass
class AstraFlowConfig:
    """The root schema: unknown top-level keys are errors."""

    seed: int = setting(0, ge=0)
    mode: str = setting("async", choices=("async", "sync"))  # sync: the trainer-centred baseline
    run_dir: str | None = None
    # the default run: 600 steps of 32 prompts x 8 samples (lr 3e-4, cosine decay) lift
    # held-out accuracy of the warm-started tiny model by ~35 points in ~3-4 minutes on
    # 2 quiet CPU cores
    steps: int = setting(600, ge=1)
    batch_size: int = setting(256, ge=1)
    group_size: int = setting(8, ge=1)
    #: the evaluator scores the held-out split every this many versions, at version 0
    #: and at the final one (0: at version 0 and the final one alone)
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

    @staticmethod
    def relations(cfg: Any) -> list[str]:
        """Settings that are each in range but do not go together."""
        out = []
        if cfg.batch_size % cfg.group_size:
            out.append(f"batch_size={cfg.batch_size}: a batch is whole groups of "
                       f"group_size={cfg.group_size} samples; make it a multiple of "
                       f"{cfg.group_size}")
        if cfg.autoscale and not 1 <= cfg.min_nodes <= cfg.num_nodes <= cfg.max_nodes:
            out.append(f"autoscale needs 1 <= min_nodes <= num_nodes <= max_nodes; got "
                       f"{cfg.min_nodes}, {cfg.num_nodes}, {cfg.max_nodes}")
        if cfg.autoscale and cfg.mode == "sync":
            out.append("autoscale=true needs mode=async: the synchronous baseline splits "
                       "each iteration across a fixed number of nodes")
        return out
