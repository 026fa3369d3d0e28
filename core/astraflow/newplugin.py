"""``astraflow new-plugin NAME --kind KIND``: a plugin package to fill in.

It writes ``astraflow-plugin-.../`` with a pyproject that registers the entry point, a
config dataclass (its settings become ``GROUP.*`` at once), an implementation whose
methods raise a clear "not implemented" error naming the file to edit, and a test that
runs the shared contract suite against it. ``pip install -e DIR`` makes the option
listed by ``astraflow plugins`` and selectable as ``GROUP=NAME``.
"""

from __future__ import annotations

import argparse
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from astraflow.commands import command
from astraflow.errors import ConfigError
from astraflow.plugins import KINDS


@dataclass(frozen=True)
class Kind:
    registry_kind: str  # the kind in the plugin registry
    base: str  # the contract class, from astraflow.contracts
    imports: str  # what the implementation's methods name
    methods: str  # the contract's methods, each raising _todo("name")
    settings: str  # the config dataclass's fields (after ``name``)
    config_base: str = ""  # a base class of the config dataclass, with its import
    contract: str = ""  # the test's contract class, and its import


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
    "data": Kind(
        "trajectory_filter", "TrajectoryFilter", "from astraflow.types import Trajectory",
        """\
    def keep(self, group: list[Trajectory]) -> bool:
        \"\"\"Whether a finished group of trajectories of one task goes to the buffer.\"\"\"
        _todo("keep")
""",
        "    #: a setting of the algorithm\n    threshold: float = 0.0\n",
        contract="from astraflow.testing.contracts import TrajectoryFilterContract"),
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


def _distribution(name: str, kind_name: str) -> str:
    """``astraflow-plugin-raas-my-engine``: the prefix the registry's hints name."""
    return KINDS[KINDS_OF_PLUGIN[kind_name].registry_kind][2] + name.replace("_", "-")


def _files(name: str, kind_name: str) -> dict[str, str]:
    kind = KINDS_OF_PLUGIN[kind_name]
    hook, group, _ = KINDS[kind.registry_kind]
    dist = _distribution(name, kind_name)
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
    """Judge ``{group}.*`` without importing the engine (the launcher calls it before
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
    """Settings of ``{group}={name}`` (``{group}.KEY=VALUE`` on the command line)."""

    name: str = "{name}"
{kind.settings}
{check_block}
@hookimpl
def {hook}(register):
    register("{name}", "{package}.impl:{cls}", {cls}Config,
             description="TODO: say in one line what {name} does."{check_arg})
'''
    impl = f'''\
"""``{group}={name}``: the {kind.base} contract (astraflow.contracts.{kind.base})."""

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
dependencies = ["astraflow"]

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


def write_plugin(name: str, kind: str, where: Path) -> Path:
    """Write the package for ``kind=NAME`` under ``where``; its directory."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(f"new-plugin {name!r}: a plugin name is lower case letters, digits "
                          "and _, starting with a letter (it becomes the option and "
                          "module name)")
    if kind not in KINDS_OF_PLUGIN:
        raise ConfigError(f"new-plugin --kind {kind}: choose one of "
                          f"{', '.join(KINDS_OF_PLUGIN)}")
    files = _files(name, kind)
    root = where / _distribution(name, kind)
    if root.exists():
        raise ConfigError(f"new-plugin: {root} already exists; remove it or choose --dir")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@command("new-plugin")
def cmd_new_plugin(argv: list[str]) -> int:
    """Write a plugin package to fill in: entry point, config, stub, contract test."""
    parser = argparse.ArgumentParser(prog="astraflow new-plugin",
                                     description=cmd_new_plugin.__doc__)
    parser.add_argument("name", help="the option's name, e.g. my_engine (raas=my_engine)")
    parser.add_argument("--kind", required=True, choices=list(KINDS_OF_PLUGIN),
                        help="what it provides")
    parser.add_argument("--dir", default=".", help="where to write the package")
    args = parser.parse_args(argv)
    root = write_plugin(args.name, args.kind, Path(args.dir))
    print(f"wrote {root}\n  pip install -e {root}\n  python -m astraflow plugins\n"
          f"  python -m pytest {root / 'tests'}")
    return 0
