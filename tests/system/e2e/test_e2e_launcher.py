"""`python -m astraflow` end to end: every component as a real process, a run directory."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import warnings

import pytest


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, tiny_model_dir):
    run_dir = tmp_path_factory.mktemp("run")
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", f"run_dir={run_dir}",
         f"model.path={tiny_model_dir}", "launcher.progress=false",
         "logger=[tensorboard,wandb,mlflow]"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_run_directory_holds_config_metrics_plot_and_summary(smoke_run):
    for name in ("config.yaml", "metrics.jsonl", "reward.png", "summary.json"):
        assert (smoke_run / name).is_file(), name
    assert any((smoke_run / "tensorboard").iterdir())
    summary = json.loads((smoke_run / "summary.json").read_text())["policies"]["policy"]
    assert summary["steps"] == 3
    assert summary["trajectories_trained"] == 3 * 8
    assert summary["trajectories_generated"] >= summary["trajectories_trained"]
    # what was generated and not trained is accounted for: left over in the buffer at
    # the end, or wasted (the fraction leaves the leftovers out)
    left = summary["trajectories_left_over"]
    assert summary["trained_fraction"] == pytest.approx(
        summary["trajectories_trained"] / (summary["trajectories_generated"] - left), abs=1e-3)
    assert summary["by_pool"]["default"]["generated"] == summary["trajectories_generated"]
    # and the ledger closes: every generated sample trained, left over or dropped (why)
    assert summary["trajectories_generated"] == (
        summary["trajectories_trained"] + left + sum(summary["trajectories_dropped"].values()))
    assert 0 <= summary["trainer_wait_fraction"] < 1
    for key in ("start_eval_accuracy", "final_eval_accuracy", "wall_seconds"):
        assert summary[key] is not None
    # start-up (every component up, the first batch rolled out and trained) is part of
    # the wall time, and said apart
    assert 0 < summary["first_step_seconds"] < summary["wall_seconds"]
    records = [json.loads(line) for line in (smoke_run / "metrics.jsonl").open()]
    versions = [r["version"] for r in records if r["kind"] == "train"]
    assert versions == sorted(versions) and versions[-1] == 3


def test_deferred_evaluation_scores_every_due_version_after_training(tmp_path,
                                                                     tiny_model_dir):
    """``eval_deferred``: no evaluation while the trainer runs, then the same versions
    a live evaluator would score (the start, every ``eval_every``, the final), and the
    weight copies kept for it removed."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", f"run_dir={run_dir}",
         f"model.path={tiny_model_dir}", "launcher.progress=false", "steps=12",
         "eval_every=4", "eval_deferred=true"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    trained = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    versions = [r["version"] for r in evals]
    assert versions[0] == 0 and versions[-1] == 12, versions
    assert versions == sorted(set(versions))
    # every due version, the last before the final one at least eval_every apart
    assert all(b - a >= 4 for a, b in itertools.pairwise(versions[:-1])), versions
    assert min(r["time"] for r in evals) > max(r["time"] for r in trained)
    assert all(0 <= r["eval_accuracy"] <= 1 for r in evals)
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    assert summary["final_eval_accuracy"] == evals[-1]["eval_accuracy"]
    kept = list(run_dir.glob("**/kept/**/v*"))
    assert kept == [], kept


def test_eval_every_zero_scores_the_start_and_the_final_version_alone(tmp_path,
                                                                      tiny_model_dir):
    """``eval_every=0``: no evaluation in between, and the run ends (its evaluator used
    to wait for a due version forever). A deferred evaluator decides what is due in the
    same loop (test_deferred_evaluation_scores_every_due_version_after_training)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", f"run_dir={run_dir}",
         f"model.path={tiny_model_dir}", "launcher.progress=false", "steps=5",
         "eval_every=0"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [r["version"] for r in records if r["kind"] == "eval"] == [0, 5]


def test_a_task_without_a_held_out_split_runs_without_an_evaluator(tmp_path, tiny_model_dir):
    """No ``task.eval_files`` or ``task.eval_size``: no evaluator holds a copy of the model
    (it scored the empty split as 0.00); the console says so, and the run ends with its
    trainer."""
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", f"run_dir={run_dir}",
         f"model.path={tiny_model_dir}", "launcher.progress=false", "task=jsonl",
         "task.train_files=[train.jsonl]"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("astraflow: task=jsonl has no held-out split, so no evaluator is started "
            "(task.eval_files or task.eval_size give one)") in proc.stderr.splitlines()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    started = [r["component"] for r in records if r.get("event") == "start"]
    assert sorted(started) == ["dataflow", "raas-0", "trainer-policy"]
    assert not [r for r in records if r["kind"] == "eval"]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    assert summary["steps"] == 3 and summary["final_eval_accuracy"] is None


def test_the_run_logged_to_wandb_and_mlflow_offline_files(smoke_run):
    """Read back with W&B's and MLflow's own readers: the same numbers as metrics.jsonl."""
    pytest.importorskip("wandb.sdk.internal.datastore",
                        reason="W&B's offline-file reader (wandb<0.30, the dev extra)")
    from astraflow.testing.loggers import mlflow_history, mlflow_run, wandb_history

    train = [json.loads(line) for line in (smoke_run / "metrics.jsonl").open()]
    train = {r["step"]: r for r in train if r["kind"] == "train"}
    assert sorted(train) == [1, 2, 3]
    rows = [r for r in wandb_history(smoke_run) if "policy/train/reward_mean" in r]
    assert [r["policy/train/step"] for r in rows] == [1, 2, 3]
    assert [r["policy/train/reward_mean"] for r in rows] == pytest.approx(
        [train[s]["reward_mean"] for s in (1, 2, 3)])
    assert all("policy/train/loss" in r for r in rows)
    evals = [r for r in wandb_history(smoke_run) if "policy/eval/accuracy" in r]
    assert evals and all(0.0 <= r["policy/eval/accuracy"] <= 1.0 for r in evals)

    history = mlflow_history(smoke_run, "policy/train/reward_mean")
    assert [step for step, _ in history] == [1, 2, 3]
    assert [value for _, value in history] == pytest.approx(
        [train[s]["reward_mean"] for s in (1, 2, 3)])
    assert len(mlflow_history(smoke_run, "policy/train/loss")) == 3
    _, run = mlflow_run(smoke_run)
    assert run.info.status == "FINISHED"
    assert run.data.params["steps"] == "3"  # the resolved config, as parameters


def test_final_weights_load_in_transformers(smoke_run, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smoke_run / "final" / "policy")
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[4, 5, 13, 10, 17]])
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == start(input_ids=ids).logits.shape
        assert not torch.equal(model(input_ids=ids).logits, start(input_ids=ids).logits)


def test_unknown_backend_fails_before_any_process_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "astraflow", "+raas=nope",
                           f"run_dir={tmp_path / 'r'}"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "pip install astraflow-plugin-raas-nope" in proc.stderr
    assert not (tmp_path / "r").exists()


def _processes_mentioning(text: str) -> list[int]:
    from pathlib import Path

    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _command(pid: int) -> str:
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "(gone)"


def _start_endless_run(run_dir, tiny_model_dir, output) -> subprocess.Popen:
    """A launcher on a run too long to end by itself, returned once it is training with
    every component up."""
    import signal

    from astraflow.testing import wait_until

    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow", f"run_dir={run_dir}", f"model.path={tiny_model_dir}",
         "steps=100000", "batch_size=8", "group_size=4", "launcher.progress=false"],
        stdout=output, stderr=output, text=True,
        # as from a terminal: a suite started in the background (`make test &` in a
        # script) passes SIGINT on as ignored, and Python then never raises Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = run_dir / "metrics" / "train-policy.jsonl"
    wait_until(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 300,
               "training to start", process=launcher)
    assert len(_processes_mentioning(str(run_dir))) >= 4  # data layer, trainer, eval, node
    return launcher


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_kill_stops_every_component(tmp_path, tiny_model_dir, sig):
    """Ctrl-C, or the SIGTERM of `kill`, `timeout` or a batch scheduler: the launcher
    stops every component and returns; none is left behind waiting for the data layer."""
    import signal

    run_dir = tmp_path / "interrupted"
    launcher = _start_endless_run(run_dir, tiny_model_dir, subprocess.PIPE)
    try:
        launcher.send_signal(getattr(signal, sig))
        _, err = launcher.communicate(timeout=150)  # the stop's bound is 90 s
        assert launcher.returncode == 130, err[-2000:]
        assert "stopping every component" in err
        if "stopping took over" in err:  # bounded, but slow: say where it was stuck
            warnings.warn(f"the stop reached its bound: {err[-4000:]}", stacklevel=1)
        assert _processes_mentioning(str(run_dir)) == []
    finally:  # a failure must not leave an endless run training for the rest of the suite
        launcher.kill()
        for pid in _processes_mentioning(str(run_dir)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_components_end_when_the_launcher_is_killed(tmp_path, tiny_model_dir):
    """A SIGKILL gives the launcher no chance to stop anything: the components notice
    that it is gone and end themselves, instead of running on with nobody to stop them."""
    import signal

    from astraflow.testing import wait_until

    run_dir = tmp_path / "killed"
    launcher = _start_endless_run(run_dir, tiny_model_dir, subprocess.DEVNULL)
    launcher.kill()
    launcher.wait(timeout=30)
    try:
        wait_until(lambda: _processes_mentioning(str(run_dir)) == [], 120,
                   "every component to end after the launcher was killed")
    except AssertionError as exc:  # name what stayed, and end it: not left to the suite
        left = {pid: _command(pid) for pid in _processes_mentioning(str(run_dir))}
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"{exc}: still running: {left}") from None
    # a node with rollouts in flight gives them no grace once its data layer is gone
    # (that data layer may still answer the first moment after the SIGTERM)
    node_log = (run_dir / "logs" / "raas-0.log").read_text()
    assert "unfinished after" not in node_log and "leave failed" not in node_log, \
        node_log[-2000:]
