"""``astraflow new-plugin NAME --kind KIND`` writes a package that installs, is listed and
selectable at once, and whose test runs the shared contract suite against the stub
(failing, until it is written, with an error that names the file to edit)."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest

from astraflow.newplugin import KINDS_OF_PLUGIN, write_plugin

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("kind", list(KINDS_OF_PLUGIN))
def test_every_kind_writes_a_package_whose_stub_is_the_contract_and_says_what_to_do(
        tmp_path, kind, monkeypatch):
    root = write_plugin(f"my_{kind}", kind, tmp_path)
    assert (root / "pyproject.toml").read_text().count("[project.entry-points.astraflow]") == 1
    monkeypatch.syspath_prepend(str(root))
    impl = importlib.import_module(f"astraflow_my_{kind}.impl")
    spec = KINDS_OF_PLUGIN[kind]
    contract = getattr(importlib.import_module("astraflow.contracts"), spec.base)
    (cls,) = [c for _, c in inspect.getmembers(impl, inspect.isclass)
              if c.__module__ == impl.__name__]
    assert issubclass(cls, contract) and not inspect.isabstract(cls)
    with pytest.raises(NotImplementedError, match=f"is not implemented yet; write it in "
                                                  f"astraflow_my_{kind}/impl.py"):
        impl._todo("x")
    compiled = subprocess.run([sys.executable, "-m", "compileall", "-q", str(root)],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout


@pytest.fixture
def cleanup():
    installed = []
    yield installed
    for dist in installed:
        subprocess.run([*PIP, "uninstall", "-y", dist], check=True, timeout=300)


@pytest.mark.parametrize(("kind", "group", "dist"), [
    ("reward", "reward", "astraflow-plugin-my-scorer"),
    ("raas", "raas", "astraflow-plugin-raas-my-scorer"),
])
def test_the_package_installs_lists_and_its_contract_test_runs(tmp_path, cleanup, kind,
                                                                group, dist):
    proc = cli("new-plugin", "my_scorer", "--kind", kind, "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / dist
    assert f"pip install -e {root}" in proc.stdout
    cleanup.append(dist)
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "-e", str(root)],
                   check=True, timeout=300)

    listed = {p["name"]: p for p in json.loads(cli("plugins", "--json").stdout)}
    assert listed["my_scorer"]["distribution"] == dist
    assert listed["my_scorer"]["provides"] == {group: ["my_scorer"]}
    assert f"{group}.name: str = 'my_scorer'" in cli("--help", f"{group}=my_scorer").stdout
    proc = cli("--cfg", "job", f"{group}=my_scorer")
    assert proc.returncode == 0 and "name: my_scorer" in proc.stdout, proc.stderr

    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(root / "tests")], capture_output=True, text=True,
                           timeout=600, cwd=root)
    # the contract runs against the stub: its checks fail, each on the stub's own words
    assert tests.returncode == 1, tests.stdout[-3000:]
    assert "is not implemented yet; write it in astraflow_my_scorer/impl.py" in tests.stdout
    summary = tests.stdout.strip().splitlines()[-1]
    assert "failed" in summary or "error" in summary, summary


def test_a_bad_name_or_an_existing_directory_is_one_line(tmp_path):
    proc = cli("new-plugin", "My-Engine", "--kind", "raas", "--dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("astraflow: error: new-plugin 'My-Engine': a plugin "
                                          "name is lower case letters")
    assert cli("new-plugin", "eng", "--kind", "raas", "--dir", str(tmp_path)).returncode == 0
    proc = cli("new-plugin", "eng", "--kind", "raas", "--dir", str(tmp_path))
    assert proc.returncode == 2 and "already exists" in proc.stderr
