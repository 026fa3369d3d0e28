"""``astraflow new-plugin NAME --kind KIND [--at POINT]`` writes a package that installs, is
listed and selectable at once, and whose test runs the shared contract suite against the
stub (failing, until it is written, with an error that names the file to edit; passing
once it is). A data algorithm is scaffolded at each point of the data path: before
rollout, after it (what ``--kind data`` alone writes) and at batch serving.

The packages are installed with ``pip install --target`` into a directory of the test's
own, put on ``PYTHONPATH`` of the processes that use them: the shared environment, which
other test files are using meanwhile, is left alone."""

from __future__ import annotations

import filecmp
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from astraflow.newplugin import DATA_POINTS, KINDS_OF_PLUGIN, kind_of, write_plugin
from astraflow.plugins import KINDS, MULTI_GROUPS

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
#: (--kind, --at) of every scaffold: each kind, and a data algorithm at each point
SCAFFOLDS = [(kind, None) for kind in KINDS_OF_PLUGIN if kind != "data"] + [
    ("data", at) for at in DATA_POINTS]
#: per data point, a few lines in place of each ``_todo``: a selector skipping the tasks
#: it saw solved, a filter dropping groups without a success, a sampler replaying a share
FILLED: dict[str, dict[str, str]] = {
    "before": {
        "should_issue": 'return task.task_id not in getattr(self, "solved", set())',
        "observe_group": """\
            self.solved = getattr(self, "solved", set()) - {task.task_id}
            if min(rewards) >= self.config.threshold:
                self.solved.add(task.task_id)""",
        "state_dict": 'return {"solved": sorted(getattr(self, "solved", set()))}',
        "load_state_dict": 'self.solved = set(state["solved"])',
    },
    "after": {"keep": "return max(t.reward for t in group) > self.config.threshold"},
    "serving": {"compose": """\
            k = min(len(consumed), n - 1, round(n * self.config.replay_ratio))
            return fresh[:n - k], consumed[:k]"""},
}


def _id(scaffold: tuple[str, str | None]) -> str:
    kind, at = scaffold
    return f"{kind}-{at}" if at else kind


def name_of(kind: str, at: str | None) -> str:
    return f"my_{at or kind}"


def cli(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def fill_in(root: Path, at: str) -> None:
    """Write the data algorithm's methods as its author would: each ``_todo`` replaced."""
    impl = next(root.glob("astraflow_*/impl.py"))
    text = impl.read_text()
    for method, body in FILLED[at].items():
        stub = f'        _todo("{method}")'
        assert stub in text, f"{impl} has no stub of {method}"
        text = text.replace(stub, textwrap.indent(textwrap.dedent(body), " " * 8))
    impl.write_text(text)


@dataclass
class Installed:
    roots: dict[str, Path]  # option name -> its package directory
    env: dict[str, str]  # the environment that sees the installed packages
    listed: dict[str, dict]  # ``astraflow plugins --json``, by plugin name

    def contract_tests(self, name: str) -> subprocess.CompletedProcess:
        """The package's own tests, run as its author runs them."""
        root = self.roots[name]
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(root / "tests")], capture_output=True, text=True,
                              timeout=600, cwd=root, env=self.env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """Every scaffold as written, and each data point's filled in as ``filled_POINT``,
    installed (one pip run) where only this module's processes look."""
    where = tmp_path_factory.mktemp("plugins")
    roots = {name_of(kind, at): write_plugin(name_of(kind, at), kind, where, at)
             for kind, at in SCAFFOLDS}
    for at in DATA_POINTS:
        roots[f"filled_{at}"] = write_plugin(f"filled_{at}", "data", where, at)
        fill_in(roots[f"filled_{at}"], at)
    target = where / "site"
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                    "--target", str(target), *map(str, roots.values())], check=True,
                   timeout=600)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(target),
                                                       os.environ.get("PYTHONPATH")]))}
    proc = cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return Installed(roots, env, {p["name"]: p for p in json.loads(proc.stdout)})


@pytest.mark.parametrize(("kind", "at"), SCAFFOLDS, ids=map(_id, SCAFFOLDS))
def test_every_kind_writes_a_package_whose_stub_is_the_contract_and_says_what_to_do(
        tmp_path, kind, at, monkeypatch):
    name = name_of(kind, at)
    root = write_plugin(name, kind, tmp_path, at)
    assert (root / "pyproject.toml").read_text().count("[project.entry-points.astraflow]") == 1
    monkeypatch.syspath_prepend(str(root))
    impl = importlib.import_module(f"astraflow_{name}.impl")
    contract = getattr(importlib.import_module("astraflow.contracts"), kind_of(kind, at).base)
    (cls,) = [c for _, c in inspect.getmembers(impl, inspect.isclass)
              if c.__module__ == impl.__name__]
    assert issubclass(cls, contract) and not inspect.isabstract(cls)
    with pytest.raises(NotImplementedError, match=f"is not implemented yet; write it in "
                                                  f"astraflow_{name}/impl.py"):
        impl._todo("x")
    compiled = subprocess.run([sys.executable, "-m", "compileall", "-q", str(root)],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout


def test_the_command_writes_each_kind_and_data_point_and_says_how_to_install_it(tmp_path):
    for kind, at in [*SCAFFOLDS, ("data", None)]:
        where = tmp_path / _id((kind, at))
        proc = cli("new-plugin", "my_option", "--kind", kind, *(["--at", at] if at else []),
                   "--dir", str(where))
        assert proc.returncode == 0, proc.stderr
        (root,) = where.iterdir()
        assert f"pip install -e {root}" in proc.stdout
        contract = kind_of(kind, at).base
        assert f"class MyOption({contract}):" in (root / "astraflow_my_option/impl.py"
                                                  ).read_text()
    # --kind data alone writes what it always has: a trajectory filter, as --at after
    alone, after = tmp_path / "data" / "astraflow-plugin-data-my-option", (
        tmp_path / "data-after" / "astraflow-plugin-data-my-option")
    assert "TrajectoryFilter" in (alone / "astraflow_my_option/impl.py").read_text()
    files = [str(p.relative_to(alone)) for p in alone.rglob("*") if p.is_file()]
    assert filecmp.cmpfiles(alone, after, files, shallow=False)[0] == files


@pytest.mark.parametrize(("kind", "at"), SCAFFOLDS, ids=map(_id, SCAFFOLDS))
def test_the_package_installs_lists_and_its_contract_fails_naming_the_file_to_edit(
        installed, kind, at):
    name = name_of(kind, at)
    group = KINDS[kind_of(kind, at).registry_kind][1]
    listed = installed.listed[name]
    assert listed["distribution"] == installed.roots[name].name
    assert listed["provides"] == {group: [name]}
    settings = f"{group}.{name}" if group in MULTI_GROUPS else group
    assert f"{settings}.name: str = '{name}'" in cli("--help", f"{group}={name}",
                                                     env=installed.env).stdout
    proc = cli("--cfg", "job", f"{group}={name}", env=installed.env)
    assert proc.returncode == 0 and f"name: {name}" in proc.stdout, proc.stderr

    tests = installed.contract_tests(name)
    # the contract runs against the stub: its checks fail, each on the stub's own words
    assert tests.returncode == 1, tests.stdout[-3000:]
    assert f"is not implemented yet; write it in astraflow_{name}/impl.py" in tests.stdout
    summary = tests.stdout.strip().splitlines()[-1]
    assert "failed" in summary or "error" in summary, summary


@pytest.mark.parametrize("at", list(DATA_POINTS))
def test_a_data_algorithm_filled_in_passes_its_contract(installed, at):
    tests = installed.contract_tests(f"filled_{at}")
    assert tests.returncode == 0, tests.stdout[-3000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary, summary


def test_a_bad_name_or_an_existing_directory_is_one_line(tmp_path):
    proc = cli("new-plugin", "My-Engine", "--kind", "raas", "--dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("astraflow: error: new-plugin 'My-Engine': a plugin "
                                          "name is lower case letters")
    assert cli("new-plugin", "eng", "--kind", "raas", "--dir", str(tmp_path)).returncode == 0
    proc = cli("new-plugin", "eng", "--kind", "raas", "--dir", str(tmp_path))
    assert proc.returncode == 2 and "already exists" in proc.stderr


def test_a_data_point_is_chosen_for_data_only_and_help_names_each(tmp_path):
    proc = cli("new-plugin", "eng", "--kind", "raas", "--at", "before", "--dir", str(tmp_path))
    assert proc.returncode == 2 and not any(tmp_path.iterdir())
    assert proc.stderr.strip() == ("astraflow: error: new-plugin --at before: --at says where "
                                   "a data algorithm acts; it goes with --kind data, not "
                                   "--kind raas")
    proc = cli("new-plugin", "cur", "--kind", "data", "--at", "during", "--dir", str(tmp_path))
    assert proc.returncode == 2 and "invalid choice: 'during'" in proc.stderr
    usage = cli("new-plugin", "--help").stdout
    for at, kind in DATA_POINTS.items():
        assert f"  {at:<8} a {kind.base}," in usage
