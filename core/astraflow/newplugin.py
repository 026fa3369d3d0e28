"""``astraflow new-plugin NAME --kind KIND``: a plugin package to fill in.

It writes ``astraflow-plugin-.../`` with a pyproject that registers the entry point, a
config dataclass (its settings become ``GROUP.*`` at once), an implementation whose
methods raise a clear "not implemented" error naming the file to edit, and a test that
runs the shared contract suite against it. ``pip install -e DIR`` makes the option
listed by ``astraflow plugins`` and selectable as ``GROUP=NAME``.

A data algorithm acts at one of three points of the data path, each its own contract:
``--kind data --at before`` (a task selector), ``after`` (a trajectory filter, the
default, what ``--kind data`` always wrote) or ``serving`` (a batch sampler).
"""

from __future__ import annotations

import argparse
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from astraflow.commands import command
from astraflow.errors import ConfigError
from astraflow.plugins import KINDS, MULTI_GROUPS


@dataclass(frozen=True)
class Kind:
    registry_kind: str  # the kind in the plugin registry
    base: str  # the contract class, from astraflow.contracts
    imports: str  # what the implementation's methods name
    methods: str  # the contract's methods, each raising _todo("name")
    settings: str  # the config dataclass's fields (after ``name``)
    config_base: str = ""  # a base class of the config dataclass, with its import
    contract: str = ""  # the test's contract class, and its import
    role: str = ""  # a sentence on its part in a run, for the implementation's docstring


_ROLLOUT = """\
    async def start(self) -> None:
        _todo("start")

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        \"\"\"``request.n`` samples of ``request.prompt_ids``, each with one behaviour
        log-prob per generated token and the weight version that made it.\"\"\"
        _todo("generate")

    async def load_weights(self, path: str, version: int) -> None:
        _todo("load_weights")

    async def pause(self) -> None:
        _todo("pause")

    async def resume(self) -> None:
        _todo("resume")

    async def shutdown(self) -> None:
        pass
"""
_TRAINER = """\
    def train_step(self, batch: Batch) -> dict[str, float]:
        _todo("train_step")

    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        _todo("compute_logprobs")

    def export_weights(self) -> dict[str, Any]:
        _todo("export_weights")

    def save_checkpoint(self, path: str) -> None:
        _todo("save_checkpoint")

    def load_checkpoint(self, path: str) -> None:
        _todo("load_checkpoint")
"""
_SELECTOR = """\
    def should_issue(self, task: Task) -> bool:
        \"\"\"Whether ``task`` is issued now; False skips it this pass (it stays in the
        dataset and comes round again).\"\"\"
        _todo("should_issue")

    def observe_group(self, task: Task, policy: str, rewards: list[float]) -> None:
        \"\"\"The rewards of a finished group of ``task`` by ``policy`` (every sample,
        before any filter): what the selection learns from.\"\"\"
        _todo("observe_group")

    def state_dict(self) -> dict[str, Any]:
        \"\"\"What it has learned, as JSON: the data layer saves it, so a restarted run
        selects as before (``{}`` if it keeps nothing).\"\"\"
        _todo("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        \"\"\"Restore what ``state_dict`` returned, on a fresh instance.\"\"\"
        _todo("load_state_dict")
"""
_FILTER = """\
    def keep(self, group: list[Trajectory]) -> bool:
        \"\"\"Whether a finished group of trajectories of one task goes to the buffer.\"\"\"
        _todo("keep")
"""
_SAMPLER = """\
    def compose(self, n: int, fresh: list[Trajectory], consumed: list[Trajectory],
                trainer_version: int) -> tuple[list[Trajectory], list[Trajectory]]:
        \"\"\"(fresh trajectories to serve, consumed ones to replay): ``n`` in all with at
        least one fresh, else the trainer waits for more; each once, and the very
        objects of the lists given. ``fresh`` is in serving order; ``consumed`` were
        trained on already (and are within the staleness bound). Random choices: save
        the generator's state in ``state_dict``, as data=replay does.\"\"\"
        _todo("compose")
"""
#: ``--kind data --at POINT``: where on the data path the algorithm acts
DATA_POINTS: dict[str, Kind] = {
    "before": Kind(
        "task_selector", "TaskSelector",
        "from typing import Any\n\nfrom astraflow.types import Task", _SELECTOR,
        "    #: a setting of the selection\n    threshold: float = 1.0\n",
        contract="from astraflow.testing.contracts import TaskSelectorContract",
        role="Before rollout, it decides which tasks are issued now (a curriculum, GRESO)."),
    "after": Kind(
        "trajectory_filter", "TrajectoryFilter", "from astraflow.types import Trajectory",
        _FILTER, "    #: a setting of the algorithm\n    threshold: float = 0.0\n",
        contract="from astraflow.testing.contracts import TrajectoryFilterContract",
        role="After rollout, it decides which finished groups go to the buffer."),
    "serving": Kind(
        "batch_sampler", "BatchSampler", "from astraflow.types import Trajectory", _SAMPLER,
        "    #: a setting of the sampler\n    replay_ratio: float = 0.25\n",
        contract="from astraflow.testing.contracts import BatchSamplerContract",
        role="At batch serving, it decides which trajectories make each batch (replay)."),
}
#: what ``--kind data`` writes without ``--at``: a trajectory filter, as it always has
DEFAULT_DATA_POINT = "after"
KINDS_OF_PLUGIN: dict[str, Kind] = {
    "raas": Kind(
        "rollout_backend", "RolloutBackend",
        "from astraflow.types import Generation, GenerationRequest", _ROLLOUT,
        "    #: an engine setting: what the engine needs to start\n"
        "    max_num_seqs: int = 64\n",
        contract="from astraflow.testing.rollout import RolloutBackendContract"),
    "trainer": Kind(
        "trainer_backend", "TrainerBackend",
        "from typing import Any\n\nfrom astraflow.types import Batch", _TRAINER, "",
        config_base="from astraflow.rl.options import PolicyGradientOptions",
        contract="from astraflow.testing.trainer import TrainerBackendContract"),
    "data": DATA_POINTS[DEFAULT_DATA_POINT],
    "workflow": Kind(
        "workflow", "Workflow",
        "from astraflow.contracts import PolicyHandle\nfrom astraflow.types import Task, "
        "Trajectory",
        """\
    roles = ("policy",)

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        \"\"\"``group_size`` attempts at ``task``: generate with ``policies[role]``,
        build trajectories with astraflow.workflows.builder.TrajectoryBuilder.\"\"\"
        _todo("run")
""",
        "    max_new_tokens: int = 16\n    temperature: float = 1.0\n",
        contract="from astraflow.testing.contracts import WorkflowContract"),
    "task": Kind(
        "task", "TaskSource", "from collections.abc import Iterator\n\n"
        "from astraflow.types import Task",
        """\
    def train_tasks(self) -> Iterator[Task]:
        _todo("train_tasks")

    def eval_tasks(self) -> list[Task]:
        _todo("eval_tasks")
""",
        "    #: where the tasks come from\n    path: str | None = None\n",
        contract="from astraflow.testing.contracts import TaskSourceContract"),
    "reward": Kind(
        "reward", "Reward", "from typing import Any\n\nfrom astraflow.types import Task",
        """\
    def __call__(self, task: Task, completion: str) -> Any:
        \"\"\"A score in [0, 1], or a dict with ``score`` and extra metrics.\"\"\"
        _todo("__call__")
""",
        "", config_base="from astraflow.rewards.base import RewardConfig",
        contract="from astraflow.testing.contracts import RewardContract"),
    "logger": Kind(
        "logger", "MetricLogger", "from typing import Any",
        """\
    def log(self, records: list[dict[str, Any]]) -> None:
        \"\"\"Send records (astraflow.loggers.base.scalars names their numbers).\"\"\"
        _todo("log")
""",
        "    #: where the metrics go\n    project: str = \"astraflow\"\n",
        contract="from astraflow.testing.contracts import LoggerContract"),
}


def _import_block(*lines: str) -> str:
    """``from M import a, b`` lines merged per module and ordered as isort does: the
    standard library's, a blank line, AstraFlow's."""
    names: dict[str, set[str]] = {}
    for line in (part for text in lines for part in text.splitlines() if part.strip()):
        module, _, imported = line.removeprefix("from ").partition(" import ")
        names.setdefault(module, set()).update(n.strip() for n in imported.split(","))
    groups: list[list[str]] = [[], []]
    for module in sorted(names):
        groups[module.split(".")[0] == "astraflow"].append(
            f"from {module} import {', '.join(sorted(names[module]))}")
    return "\n\n".join("\n".join(group) for group in groups if group)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def kind_of(kind_name: str, at: str | None = None) -> Kind:
    """What ``--kind KIND_NAME [--at AT]`` writes; a ConfigError naming the choices if
    there is no such kind, or ``at`` is given for a kind other than data."""
    if kind_name not in KINDS_OF_PLUGIN:
        raise ConfigError(f"new-plugin --kind {kind_name}: choose one of "
                          f"{', '.join(KINDS_OF_PLUGIN)}")
    if at is None:
        return KINDS_OF_PLUGIN[kind_name]
    if kind_name != "data":
        raise ConfigError(f"new-plugin --at {at}: --at says where a data algorithm acts; "
                          f"it goes with --kind data, not --kind {kind_name}")
    if at not in DATA_POINTS:
        raise ConfigError(f"new-plugin --kind data --at {at}: choose one of "
                          f"{', '.join(DATA_POINTS)}")
    return DATA_POINTS[at]


def _distribution(name: str, kind: Kind) -> str:
    """``astraflow-plugin-raas-my-engine``: the prefix the registry's hints name."""
    return KINDS[kind.registry_kind][2] + name.replace("_", "-")


def _files(name: str, kind_name: str, kind: Kind) -> dict[str, str]:
    hook, group, _ = KINDS[kind.registry_kind]
    dist = _distribution(name, kind)
    # a group of which a run selects several options keeps each one's settings apart
    prefix = f"{group}.{name}" if group in MULTI_GROUPS else group
    package = f"astraflow_{name}"
    cls = _camel(name)
    config_base = kind.config_base.rsplit(" ", 1)[-1] if kind.config_base else ""
    contract_cls = kind.contract.rsplit(" ", 1)[-1]
    option_attr = ("backend_name" if kind_name in ("raas", "trainer") else "option")
    impl_file = f"{package}/impl.py"
    # an engine's settings are judged before anything starts, without importing it
    engine = kind_name in ("raas", "trainer")
    check_block = f'''
def check_config(config) -> None:
    """Judge ``{prefix}.*`` without importing the engine (the launcher calls it before
    anything starts, so keep heavy imports out): raise ValueError naming a setting this
    engine cannot run."""

''' if engine else ""
    check_arg = ",\n             check=check_config" if engine else ""
    init = f'''\
"""``{group}={name}``: registers the option; the implementation is in impl.py, imported
only when a run selects it."""

{_import_block("from dataclasses import dataclass", "from astraflow import hookimpl",
               kind.config_base)}


@dataclass
class {cls}Config{f"({config_base})" if config_base else ""}:
    """Settings of ``{group}={name}`` (``{prefix}.KEY=VALUE`` on the command line)."""

    name: str = "{name}"
{kind.settings}
{check_block}
@hookimpl
def {hook}(register):
    register("{name}", "{package}.impl:{cls}", {cls}Config,
             description="TODO: say in one line what {name} does."{check_arg})
'''
    role = f"\n\n{kind.role}" if kind.role else ""
    impl = f'''\
"""``{group}={name}``: the {kind.base} contract (astraflow.contracts.{kind.base}).{role}
"""

from __future__ import annotations

{_import_block(kind.imports, f"from astraflow.contracts import {kind.base}")}


def _todo(method: str):
    raise NotImplementedError(f"{group}={name}: {kind.base}.{{method}} is not implemented "
                              "yet; write it in {impl_file}")


class {cls}({kind.base}):
{kind.methods}'''
    test = f'''\
"""``{group}={name}`` passes AstraFlow's shared {kind.base} contract."""

{kind.contract}


class Test{cls}({contract_cls}):
    {option_attr} = "{name}"
'''
    pyproject = f'''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "AstraFlow plugin: {group}={name}"
requires-python = ">=3.11"
dependencies = ["astraflow>=1,<2"]

[project.entry-points.astraflow]
{name} = "{package}"

[tool.setuptools.packages.find]
include = ["{package}*"]
'''
    readme = f'''\
# {dist}

An AstraFlow plugin providing `{group}={name}`.

    pip install -e .                  # then: python -m astraflow plugins
    python -m astraflow --help {group}={name}
    python -m pytest tests            # the shared {kind.base} contract

Fill in `{impl_file}` (each method says so until it is written) and the settings in
`{package}/__init__.py`; select it with `python -m astraflow {group}={name}`.
'''
    return {"pyproject.toml": pyproject, "README.md": readme,
            f"{package}/__init__.py": init, impl_file: impl,
            f"tests/test_{name}.py": test}


def write_plugin(name: str, kind: str, where: Path, at: str | None = None) -> Path:
    """Write the package for ``kind=NAME`` under ``where``; its directory. ``at``: where
    a data algorithm acts (:data:`DATA_POINTS`), :data:`DEFAULT_DATA_POINT` if None."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(f"new-plugin {name!r}: a plugin name is lower case letters, digits "
                          "and _, starting with a letter (it becomes the option and "
                          "module name)")
    spec = kind_of(kind, at)
    files = _files(name, kind, spec)
    root = where / _distribution(name, spec)
    if root.exists():
        raise ConfigError(f"new-plugin: {root} already exists; remove it or choose --dir")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


_EPILOG = """\
a data algorithm (--kind data) acts at one point of the data path, chosen by --at:
  before   a TaskSelector, before rollout: which tasks are issued now (a curriculum,
           GRESO); should_issue, observe_group, state_dict/load_state_dict
  after    a TrajectoryFilter, after rollout: which finished groups go to the
           buffer; keep (the default: what --kind data alone writes)
  serving  a BatchSampler, at batch serving: which fresh and already-trained
           trajectories make a batch (replay); compose

examples:
  astraflow new-plugin my_engine --kind raas
  astraflow new-plugin my_curriculum --kind data --at before
"""


@command("new-plugin")
def cmd_new_plugin(argv: list[str]) -> int:
    """Write a plugin package to fill in: entry point, config, stub, contract test."""
    parser = argparse.ArgumentParser(prog="astraflow new-plugin",
                                     description=cmd_new_plugin.__doc__, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the option's name, e.g. my_engine (raas=my_engine)")
    parser.add_argument("--kind", required=True, choices=list(KINDS_OF_PLUGIN),
                        help="what it provides")
    parser.add_argument("--at", choices=list(DATA_POINTS),
                        help="with --kind data: where on the data path it acts (below); "
                             f"default {DEFAULT_DATA_POINT}")
    parser.add_argument("--dir", default=".", help="where to write the package")
    args = parser.parse_args(argv)
    root = write_plugin(args.name, args.kind, Path(args.dir), args.at)
    print(f"wrote {root}\n  pip install -e {root}\n  python -m astraflow plugins\n"
          f"  python -m pytest {root / 'tests'}")
    return 0
