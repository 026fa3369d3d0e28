"""A plugin written outside this repository is discovered, listed and selectable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.newplugin import write_plugin

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def _write_plugin(where: Path) -> Path:
    """A rollout-backend plugin as its author would start it (``astraflow new-plugin``),
    at version 3.1.4 with a setting of its own."""
    root = write_plugin("toyengine", "raas", where)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"',
                                                       'version = "3.1.4"'))
    init = root / "astraflow_toyengine" / "__init__.py"
    init.write_text(init.read_text().replace('    max_num_seqs: int = 64\n',
                                             '    speed: float = 2.5\n'))
    return root


def _cli(*args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)} if site else None
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture
def installed_plugin(tmp_path) -> Path:
    """The plugin pip-installed into a directory of its own, as a user's environment
    would have it (entry points are found on ``sys.path``): the environment the tests
    run in is left alone."""
    root = _write_plugin(tmp_path)
    site = tmp_path / "site"
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(root)], check=True, timeout=300)
    return site


def test_third_party_plugin_is_discovered_listed_and_selectable(installed_plugin):
    site = installed_plugin
    listed = {p["name"]: p for p in json.loads(_cli("plugins", "--json", site=site).stdout)}
    assert listed["toyengine"]["distribution"] == "astraflow-plugin-raas-toyengine"
    assert listed["toyengine"]["version"] == "3.1.4"
    assert listed["toyengine"]["provides"] == {"raas": ["toyengine"]}

    for spelling in ("+raas=toyengine", "raas=toyengine"):
        proc = _cli("--cfg", spelling, "raas.speed=7.5", site=site)
        assert proc.returncode == 0, proc.stderr
        assert "name: toyengine" in proc.stdout and "speed: 7.5" in proc.stdout

    proc = _cli("--cfg", "+raas=toyengine", "+raas.sped=1", site=site)
    assert proc.returncode == 2 and "raas.sped" in proc.stderr


def test_uninstalled_plugin_selection_explains_how_to_install():
    proc = _cli("--cfg", "+raas=toyengine")
    assert proc.returncode == 2
    assert "raas=toyengine is not installed" in proc.stderr
    assert "Installed options: " in proc.stderr and "hf" in proc.stderr
    assert "pip install astraflow-plugin-raas-toyengine" in proc.stderr
