"""The plugin compatibility suite: third-party plugins written against AstraFlow 1.0 still
install, pass their own contract tests and run.

The packages in ``tests/compat/packages`` are plugins as their authors write them against
the public plugin API of version 1.0 (``astraflow.api.PUBLIC``) and nothing else:

- ``astraflow-compat-tasks``: ``task=compat_sums`` (a TaskSource with its own config,
  bounds declared with ``setting`` and a ``preflight``), ``data=compat_mastery`` (a
  TaskSelector keeping per-task counts as JSON state) and ``reward=compat_digits`` (a
  Reward with a RewardConfig subclass, returning a score and an extra metric);
- ``astraflow-compat-workflow``: ``workflow=compat_prefixed``, a SingleTurnWorkflow
  subclass whose config declares only what it uses (no ``latency``);
- ``astraflow-compat-engine``: ``raas=compat_engine``, a RolloutBackend sampling with
  transformers on the CPU (with a ``check`` registered);
- ``astraflow-compat-trainer``: ``trainer=compat_trainer``, a PolicyGradientBackend with
  a PolicyGradientOptions config and a metric of its own;
- ``astraflow-compat-logger``: ``logger=compat_jsonl``, a MetricLogger writing JSON Lines
  into the run directory.

This module installs them as a user does (``pip install --target`` into a directory of
its own, put on ``PYTHONPATH`` of the processes it starts: entry points are found on
``sys.path``, and the shared environment is left alone), runs their own tests (the shared
contract suites), and runs two short jobs: the compat engine and trainer under the
built-in task, workflow, reward and logger; and the compat task, selector, workflow,
reward and logger on the built-in engine and trainer.

**The packages are frozen.** Never edit them to make this suite pass again: a change of
the core that breaks one of them breaks every plugin written the same way, so it is the
core that changes. A deliberate break of the plugin API updates them in the same commit
that bumps astraflow's major version (their ``astraflow>=1,<2`` requirement with it,
which :func:`test_the_packages_require_the_installed_major_version` checks) and writes
the changelog entry (``docs/changelog.md``) saying what plugin authors must change.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

import astraflow
from astraflow.api import PUBLIC
from astraflow.testing import run_summary

PACKAGES = Path(__file__).resolve().parents[2] / "compat" / "packages"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
#: entry point -> (distribution, what it provides)
PLUGINS = {
    "compat_tasks": ("astraflow-compat-tasks", {
        "task": ["compat_sums"], "data": ["compat_mastery"], "reward": ["compat_digits"]}),
    "compat_workflow": ("astraflow-compat-workflow", {"workflow": ["compat_prefixed"]}),
    "compat_engine": ("astraflow-compat-engine", {"raas": ["compat_engine"]}),
    "compat_trainer": ("astraflow-compat-trainer", {"trainer": ["compat_trainer"]}),
    "compat_logger": ("astraflow-compat-logger", {"logger": ["compat_jsonl"]}),
}
#: a few seconds of every component: 3 steps of 2 groups of 2 samples
SHORT = ["launcher.progress=false", "steps=3", "batch_size=4", "group_size=2",
         "eval_every=3", "run_dir=run"]
#: the task pack's options, with 4 training sums: the selector sees tasks come round
TASK_PACK = ["task=compat_sums", "task.num_train=4", "data=[compat_mastery]",
             "reward=compat_digits"]
PREFIX = "q:"
#: what torch's extensions print at exit, drowning a component's own last words
NOISE = re.compile(r"leaked|nanobind|skipped remainder")


@dataclass
class Site:
    packages: Path  # copies of the packages (pip builds in the source tree)
    target: Path  # where they are installed
    env: dict[str, str]  # an environment that sees them

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=self.env)


@dataclass
class Job:
    run_dir: Path
    stderr: str

    def records(self, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.run_dir / name).read_text().splitlines()]

    def train(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("kind") == "train"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    """Every package installed in one pip run, as a user installs a plugin."""
    where = tmp_path_factory.mktemp("compat")
    copies = where / "packages"
    shutil.copytree(PACKAGES, copies,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    target = where / "site"
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                    "--target", str(target), *map(str, sorted(copies.iterdir()))],
                   check=True, timeout=600)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(target),
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("PYTEST_ADDOPTS", None)  # the packages' own tests run as their authors run them
    return Site(copies, target, env)


def _job(site: Site, cwd: Path, *overrides: str) -> Job:
    """``python -m astraflow`` in ``cwd`` as a user runs it; the run must succeed."""
    proc = site.run("-m", "astraflow", *SHORT, *overrides, cwd=cwd, timeout=300)
    if proc.returncode != 0:
        logs = "".join(
            f"\n--- {log.name}\n" + "\n".join(
                line for line in log.read_text(errors="replace").splitlines()
                if not NOISE.search(line))[-2000:]
            for log in sorted((cwd / "run" / "logs").glob("*.log")))
        pytest.fail(f"python -m astraflow {' '.join(overrides)} exited {proc.returncode}:\n"
                    f"{proc.stderr[-3000:]}{logs}")
    return Job(cwd / "run", proc.stderr)


@pytest.fixture(scope="module")
def engine_trainer_job(site, tiny_model_dir, tmp_path_factory) -> Job:
    return _job(site, tmp_path_factory.mktemp("engine-trainer"), f"model.path={tiny_model_dir}",
                "raas=compat_engine", "trainer=compat_trainer")


@pytest.fixture(scope="module")
def task_pack_job(site, tiny_model_dir, tmp_path_factory) -> Job:
    return _job(site, tmp_path_factory.mktemp("task-pack"), f"model.path={tiny_model_dir}",
                *TASK_PACK, "workflow=compat_prefixed", f"workflow.prompt_prefix={PREFIX}",
                "logger=[compat_jsonl]", "record_batches=true")


# -- installed as a user installs them ---------------------------------------------------


def test_the_packages_import_only_the_public_plugin_api():
    """Each ``from astraflow... import NAME`` (and ``astraflow.NAME``) of the packages is
    in ``astraflow.api.PUBLIC``: a name leaving it breaks them."""
    outside = []
    for path in sorted(PACKAGES.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            used: list[tuple[str, str]] = []
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module == "astraflow" or node.module.startswith("astraflow.")):
                used = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "astraflow":
                used = [("astraflow", node.attr)]
            outside += [f"{path.relative_to(PACKAGES)}:{node.lineno}: {module}.{name}"
                        for module, name in used if name not in PUBLIC.get(module, ())]
    assert not outside, "names outside astraflow.api.PUBLIC:\n" + "\n".join(outside)


def test_the_packages_require_the_installed_major_version(site):
    for dist in importlib.metadata.distributions(path=[str(site.target)]):
        reqs = [Requirement(r) for r in dist.requires or []]
        (req,) = [r for r in reqs if r.name == "astraflow"]
        assert req.specifier.contains(astraflow.__version__, prereleases=True), (
            f"{dist.metadata['Name']} requires {req} and this is astraflow "
            f"{astraflow.__version__}: a major version updates the frozen packages in the "
            "same commit (see this module's docstring)")


def test_the_packages_are_listed_with_what_they_provide(site):
    proc = site.run("-m", "astraflow", "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = {p["name"]: p for p in json.loads(proc.stdout)}
    for plugin, (distribution, provides) in PLUGINS.items():
        assert plugin in listed, f"{plugin} is not discovered: {sorted(listed)}"
        info = listed[plugin]
        assert "error" not in info, f"{plugin} failed to load: {info['error']}"
        assert (info["distribution"], info["version"]) == (distribution, "1.0.0")
        assert {group: sorted(options) for group, options in info["provides"].items()} \
            == provides


def test_every_option_composes_with_its_own_settings(site):
    proc = site.run("-m", "astraflow", "--cfg", "job", "raas=compat_engine",
                    "trainer=compat_trainer", *TASK_PACK, "reward.partial=0.25",
                    "workflow=compat_prefixed", f"workflow.prompt_prefix={PREFIX}",
                    "logger=[compat_jsonl]", "trainer.lr=1e-4")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["raas"] == {"name": "compat_engine", "num_threads": 1}
    assert cfg["trainer"]["name"] == "compat_trainer" and cfg["trainer"]["lr"] == 1e-4
    assert cfg["task"] == {"name": "compat_sums", "max_operand": 9, "num_train": 4,
                           "num_eval": 8, "seed": 0}
    assert cfg["data"] == {"compat_mastery": {"name": "compat_mastery", "patience": 2,
                                              "revisit_every": 4, "policy": None}}
    assert cfg["reward"]["name"] == "compat_digits" and cfg["reward"]["partial"] == 0.25
    assert cfg["reward"]["timeout"] == 10.0  # RewardConfig's, inherited
    assert cfg["workflow"] == {"name": "compat_prefixed", "max_new_tokens": 6,
                               "temperature": 1.0, "prompt_prefix": PREFIX}
    assert cfg["logger"] == {"compat_jsonl": {"file": "compat-metrics.jsonl"}}


@pytest.mark.parametrize(("overrides", "said"), [
    # the bounds the packages declare with setting()
    (["task=compat_sums", "task.num_train=0", "data=[compat_mastery]",
      "data.compat_mastery.patience=0", "reward=compat_digits", "reward.partial=2"],
     ["task.num_train", "data.compat_mastery.patience", "reward.partial"]),
    # a task source's preflight
    (["task=compat_sums", "task.max_operand=1"],
     ["task.num_train + task.num_eval = 32 but task.max_operand=1 gives 4 sums"]),
    # a workflow's check_config
    (["workflow=compat_prefixed", "workflow.prompt_prefix=" + "x" * 40],
     ["workflow.prompt_prefix is 40 characters long; at most 32"]),
], ids=["bounds", "task-preflight", "workflow-check"])
def test_settings_a_plugin_refuses_stop_the_run_before_it_starts(site, tmp_path,
                                                                  tiny_model_dir,
                                                                  overrides, said):
    proc = site.run("-m", "astraflow", *SHORT, f"model.path={tiny_model_dir}", *overrides,
                    cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    for text in said:
        assert text in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_the_packages_pass_their_own_contract_tests(site):
    """Each package's tests, as its author runs them: every one passes, none skipped."""
    report = site.target.parent / "contracts.xml"
    tests = [str(package / "tests") for package in sorted(site.packages.iterdir())]
    proc = site.run("-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                    *tests, cwd=site.packages, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    cases = list(ET.parse(report).getroot().iter("testcase"))
    not_passed = [f"{case.get('classname')}::{case.get('name')}: {child.tag}"
                  for case in cases for child in case
                  if child.tag in ("failure", "error", "skipped")]
    assert not not_passed, not_passed
    ran = {part for case in cases for part in case.get("classname").split(".")
           if part.startswith("test_compat_")}
    assert ran == {f"test_{plugin}" for plugin in PLUGINS}, ran


# -- a job on the compat engine and trainer ----------------------------------------------


def test_the_compat_engine_and_trainer_train_the_steps_asked(engine_trainer_job):
    run = engine_trainer_job.run_dir
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["raas"]["name"], cfg["trainer"]["name"]) == ("compat_engine", "compat_trainer")
    summary = run_summary(run)["policy"]
    assert (summary["steps"], summary["final_version"]) == (3, 3)
    assert summary["trajectories_trained"] == 3 * 4
    assert summary["trajectories_generated"] >= summary["trajectories_trained"]
    # the evaluator's engine scored the start and the final version
    assert summary["start_eval_accuracy"] is not None
    assert summary["final_eval_accuracy"] is not None


def test_the_compat_engine_loads_the_versions_it_is_sent(engine_trainer_job):
    refreshed = [r for r in engine_trainer_job.records() if r.get("kind") == "refresh"]
    versions = [r["version"] for r in refreshed]
    assert versions and versions == sorted(versions) and versions[-1] <= 3, versions


def test_the_compat_trainer_stepped_on_the_engines_logprobs(engine_trainer_job):
    train = engine_trainer_job.train()
    assert [r["step"] for r in train] == [1, 2, 3]
    for record in train:  # the shared step's metrics and the trainer's own
        for key in ("train/loss", "train/grad_norm", "train/weight_norm"):
            assert math.isfinite(record[key]), (key, record)
    # step 1 trains on samples of the start weights, which both hold: the engine's
    # log-probs are the trainer's
    assert train[0]["train/rollout_logprob_gap_fresh"] < 1e-3, train[0]


def test_the_compat_trainer_writes_the_final_model(engine_trainer_job):
    final = engine_trainer_job.run_dir / "final" / "policy"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (final / name).is_file(), name


# -- a job with the compat task, selector, workflow, reward and logger -------------------


def test_the_task_pack_and_workflow_train_the_steps_asked(task_pack_job):
    summary = run_summary(task_pack_job.run_dir)["policy"]
    assert (summary["steps"], summary["trajectories_trained"]) == (3, 3 * 4)
    assert summary["start_eval_accuracy"] is not None  # on the task's held-out sums
    assert summary["final_eval_accuracy"] is not None


def test_every_trained_prompt_is_a_sum_with_the_workflows_prefix(task_pack_job,
                                                                   tiny_model_dir):
    from astraflow.text import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    batches = task_pack_job.records("metrics/batches-policy.jsonl")
    assert [b["step"] for b in batches] == [1, 2, 3]
    for item in (item for batch in batches for item in batch["items"]):
        trajectory = item["trajectory"]
        (prompt,) = [s for s in trajectory["spans"] if s["source"] == "prompt"]
        text = tokenizer.decode(trajectory["tokens"][prompt["start"]:prompt["end"]])
        sums = re.fullmatch(re.escape(PREFIX) + r"(\d+)\+(\d+)=", text)
        assert sums, text
        assert trajectory["task_id"].startswith(f"sums-{sums[1]}+{sums[2]}#"), trajectory


def test_the_compat_reward_scored_every_sample(task_pack_job):
    train = task_pack_job.train()
    assert [r["step"] for r in train] == [1, 2, 3]
    for record in train:
        assert record["reward_failed"] == 0
        assert 0.0 <= record["reward/exact"] <= 1.0  # the reward's extra metric
        assert 0.0 <= record["reward_mean"] <= 1.0


def test_the_compat_selector_kept_count_of_every_group(task_pack_job):
    """The data layer saved the selector's state: a count for each of the 4 training
    sums, which came round, and every trained group among them."""
    store = task_pack_job.run_dir / "store" / "dataflow.sqlite3"
    with sqlite3.connect(store) as db:
        (state,) = db.execute("SELECT state FROM plugin_state WHERE name = ?",
                              ("compat_mastery",)).fetchone()
    counts = json.loads(state)["counts"]
    assert len(counts) == 4 and all(t.startswith("sums-") for t in counts), counts
    groups = sum(groups for _, _, groups in counts.values())
    assert groups >= 3 * 4 // 2, counts
    assert all(asked >= groups for asked, _, groups in counts.values()), counts


def test_the_compat_logger_received_the_run(task_pack_job):
    assert "logger=compat_jsonl failed" not in task_pack_job.stderr, task_pack_job.stderr
    lines = task_pack_job.records("compat-metrics.jsonl")
    assert lines[0] == {"event": "open", "astraflow": astraflow.__version__, "steps": 3}
    assert lines[-1] == {"event": "close"}
    train = [line for line in lines if line.get("kind") == "train"]
    assert [line["step"] for line in train] == [1, 2, 3]
    for line in train:
        assert line["policy"] == "policy"
        assert {"policy/train/loss", "policy/train/reward_mean",
                "policy/train/reward/exact"} <= line["scalars"].keys()
    evals = [line["step"] for line in lines if line.get("kind") == "eval"]
    assert evals[0] == 0 and evals[-1] == 3, evals
