"""An advantage estimator from a package of its own (``packages/astraflow-advantage-fixed``,
``policies.<name>.advantage=fixed_baseline``) is listed, passes its contract, is
selectable per policy, and is what a real run's trainer gets: ``(reward - 0.5) * 0.5``,
its group stage at intake and its batch stage at serving."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent / "packages" / "astraflow-advantage-fixed"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
SELECT = "policies.policy.advantage=fixed_baseline"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict[str, str]:
    """The package pip-installed into a directory of its own, as a user installs a
    plugin; the environment of the processes that should see it."""
    where = tmp_path_factory.mktemp("advantage-plugin")
    shutil.copytree(PACKAGE, where / "package",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                    "--target", str(where / "site"), str(where / "package")],
                   check=True, timeout=300)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(where / "site")}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_the_estimator_is_listed_and_passes_its_contract(site):
    listed = {p["name"]: p for p in json.loads(
        _run("-m", "astraflow", "plugins", "--json", env=site).stdout)}
    assert listed["fixed_baseline"]["distribution"] == "astraflow-advantage-fixed"
    assert listed["fixed_baseline"]["version"] == "0.2.0"
    assert listed["fixed_baseline"]["provides"] == {"advantage_estimator": ["fixed_baseline"]}
    assert listed["builtins"]["provides"]["advantage_estimator"] == [
        "grpo", "dr_grpo", "rloo", "reinforce_pp"]

    package = Path(site["PYTHONPATH"]).parent / "package"
    proc = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", env=site,
                cwd=package)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "6 passed, 1 skipped" in proc.stdout, proc.stdout[-2000:]


def test_a_policy_selects_it_and_an_uninstalled_one_is_refused_in_one_line(site):
    proc = _run("-m", "astraflow", "--cfg", SELECT, env=site)
    assert proc.returncode == 0, proc.stderr
    assert "advantage: fixed_baseline" in proc.stdout

    proc = _run("-m", "astraflow", "--cfg", SELECT)  # not on this interpreter's path
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert ("policies.policy.advantage=fixed_baseline is not installed. Installed options: "
            "dr_grpo, grpo, reinforce_pp, rloo.") in lines[0]
    assert "pip install astraflow-plugin-advantage-fixed-baseline" in lines[0]


def test_a_run_trains_on_the_advantages_it_gives(site, tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = _run("-m", "astraflow", "+experiment=smoke", f"run_dir={run_dir}",
                f"model.path={tiny_model_dir}", "launcher.progress=false",
                "record_batches=true", SELECT, env=site, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    batches = [json.loads(line) for line in
               (run_dir / "metrics" / "batches-policy.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [1, 2, 3]
    for batch in batches:
        assert len(batch["items"]) == 8
        for item in batch["items"]:
            trajectory = item["trajectory"]
            failed = trajectory["outcome"]["failed"]
            expected = 0.0 if failed else (trajectory["reward"] - 0.5) * 0.5
            assert item["advantage"] == expected, (trajectory["reward"], item["advantage"])
