"""A run whose task has no held-out split starts no evaluator: one would hold a copy of
the model (a rollout engine: 1-2 GB at 0.5B parameters) with nothing to score. The
launcher's pre-flight and component list, and the memory estimate it checks, with no
process started; an evaluator started anyway ends without an engine."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import compose_config
from astraflow.launch import memory
from astraflow.launch.local import LocalRun
from astraflow.launch.prepare import prepare_run
from astraflow.lifecycle import READY_ENV


@dataclass
class Recorded(LocalRun):
    """The local launcher, its components named but not started."""

    started: list[str] = field(default_factory=list)

    def spawn(self, name: str, *args: str, pass_fds: tuple[int, ...] = ()) -> Any:
        self.started.append(name)


def prepared(tmp_path: Path, model: str, *overrides: str) -> tuple[Any, Path, bool]:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return prepare_run(compose_config([f"model.path={model}", "task=jsonl",
                                       f"task.train_files=[{train}]",
                                       f"run_dir={tmp_path / 'run'}", *overrides]))


def test_a_task_without_a_held_out_split_starts_no_evaluator(tmp_path, tiny_model_dir):
    cfg, run_dir, evaluated = prepared(tmp_path, tiny_model_dir)
    assert not evaluated
    job = Recorded(cfg, run_dir, "token", evaluated=evaluated)
    job.start_components()
    assert job.started == ["trainer-policy", "raas-0"]
    est = memory.estimate(cfg, prompt_tokens=8, gpu=False, machine=64 * memory.GIB,
                          evaluated=evaluated)
    assert [p.name for p in est.parts] == ["trainer-policy", "rollout node",
                                           "launcher and data layer"]


def test_a_held_out_split_gets_its_evaluator(tmp_path, tiny_model_dir):
    cfg, run_dir, evaluated = prepared(tmp_path, tiny_model_dir, "task.eval_size=4")
    assert evaluated
    job = Recorded(cfg, run_dir, "token", evaluated=evaluated)
    job.start_components()
    assert job.started == ["trainer-policy", "eval-policy", "raas-0"]
    est = memory.estimate(cfg, prompt_tokens=8, gpu=False, machine=64 * memory.GIB)
    assert "eval-policy" in [p.name for p in est.parts]


def test_an_evaluator_with_nothing_to_score_ends_without_an_engine(tmp_path, tiny_model_dir,
                                                                 monkeypatch):
    """``astraflow eval`` started by hand (or by another launcher) on such a run."""
    from astraflow import evaluate

    cfg, run_dir, _ = prepared(tmp_path, tiny_model_dir)

    async def no_engine(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("an engine was started with nothing to evaluate")

    monkeypatch.setattr(evaluate, "start_engines", no_engine)
    ready = tmp_path / "eval.ready"
    monkeypatch.setenv(READY_ENV, str(ready))
    evaluator = evaluate.Evaluator(cfg, "http://127.0.0.1:9", "token", "policy",
                                   str(run_dir), str(run_dir / "metrics" / "eval.jsonl"))
    asyncio.run(evaluator.run())
    assert ready.exists()  # it set up and ended well: the launcher counts it finished
    assert not (run_dir / "metrics" / "eval.jsonl").exists()  # no score of nothing


def test_preparing_a_run_leaves_the_config_it_was_given_as_it_was(tmp_path, tiny_model_dir,
                                                                   monkeypatch):
    """The resolved config (run directory, policies, paths, sync staleness) is a new one:
    the caller's, validated as composed, is not changed under it."""
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)  # relative paths, resolved against it
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    given = compose_config([f"model.path={tiny_model_dir}", "task=jsonl", "mode=sync",
                            "task.train_files=[train.jsonl]", "run_dir=run"])
    before = OmegaConf.to_yaml(given)
    resolved, run_dir, _ = prepare_run(given)
    assert OmegaConf.to_yaml(given) == before
    assert resolved.run_dir == str(run_dir) != given.run_dir
    assert resolved.policies.policy.max_staleness == 0  # sync: resolved, in the copy alone
