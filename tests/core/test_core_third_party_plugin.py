"""A plugin written outside this repository is discovered, listed and selectable."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def _write_plugin(root: Path) -> None:
    (root / "astraflow_toyengine").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "astraflow-plugin-raas-toyengine"
        version = "3.1.4"
        dependencies = ["astraflow"]

        [project.entry-points.astraflow]
        toyengine = "astraflow_toyengine"
    """))
    (root / "astraflow_toyengine" / "__init__.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass

        from astraflow import hookimpl


        @dataclass
        class ToyEngineConfig:
            name: str = "toyengine"
            speed: float = 2.5


        @hookimpl
        def astraflow_register_rollout_backends(register):
            register("toyengine", "astraflow_toyengine.engine:ToyEngine", ToyEngineConfig)
    """))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def installed_plugin(tmp_path):
    _write_plugin(tmp_path / "toyengine")
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation",
                    str(tmp_path / "toyengine")], check=True, timeout=300)
    try:
        yield
    finally:
        subprocess.run([*PIP, "uninstall", "-y", "astraflow-plugin-raas-toyengine"],
                       check=True, timeout=300)


def test_third_party_plugin_is_discovered_listed_and_selectable(installed_plugin):
    listed = {p["name"]: p for p in json.loads(_cli("plugins", "--json").stdout)}
    assert listed["toyengine"]["distribution"] == "astraflow-plugin-raas-toyengine"
    assert listed["toyengine"]["version"] == "3.1.4"
    assert listed["toyengine"]["provides"] == {"raas": ["toyengine"]}

    for spelling in ("+raas=toyengine", "raas=toyengine"):
        proc = _cli("--cfg", spelling, "raas.speed=7.5")
        assert proc.returncode == 0, proc.stderr
        assert "name: toyengine" in proc.stdout and "speed: 7.5" in proc.stdout

    proc = _cli("--cfg", "+raas=toyengine", "+raas.sped=1")
    assert proc.returncode == 2 and "raas.sped" in proc.stderr


def test_uninstalled_plugin_selection_explains_how_to_install():
    proc = _cli("--cfg", "+raas=toyengine")
    assert proc.returncode == 2
    assert "raas=toyengine is not installed" in proc.stderr
    assert "Installed options: " in proc.stderr and "hf" in proc.stderr
    assert "pip install astraflow-plugin-raas-toyengine" in proc.stderr
