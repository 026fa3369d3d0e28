"""``ray job submit -- python -m astraflow launcher=ray ...``: the run is a Ray job on
the cluster (its driver runs on the head), and stopping the job stops every component."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launched_runs import pids_of, wait_for

RAY = str(Path(sys.executable).with_name("ray"))


def ray_job(server: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    verb, *rest = args
    return subprocess.run([RAY, "job", verb, "--address", server, *rest], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ})


def test_a_submitted_run_trains_to_the_end(job_server, tmp_path):
    run_dir = tmp_path / "run"
    proc = ray_job(job_server, "submit", "--", "python", "-m", "astraflow", "launcher=ray",
                   "launcher.address=auto", "+experiment=smoke", "+raas=sim",
                   f"run_dir={run_dir}", "launcher.progress=false")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "succeeded" in proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    assert summary["steps"] == 3
    assert (run_dir / "final" / "policy" / "config.json").exists()


def test_stopping_the_job_stops_every_component(job_server, tmp_path):
    run_dir, machines = tmp_path / "run", tmp_path / "machines"
    submit = ray_job(job_server, "submit", "--no-wait", "--", "python", "-m", "astraflow",
                     "launcher=ray", "launcher.address=auto", "+raas=sim", "steps=500",
                     f"run_dir={run_dir}", f"launcher.work_dir={machines}",
                     "launcher.progress=false", timeout=120)
    assert submit.returncode == 0, submit.stderr[-2000:]
    job_id = next(word.strip("'") for line in (submit.stdout + submit.stderr).splitlines()
                  if "submitted successfully" in line for word in line.split()
                  if word.strip("'").startswith("raysubmit_"))

    def training() -> bool:
        path = run_dir / "metrics" / "train-policy.jsonl"
        return path.exists() and path.stat().st_size > 0

    wait_for(training, 240, "the submitted run to train")
    assert pids_of(" raas ", str(machines))  # the run's nodes, by their work dirs
    stop = ray_job(job_server, "stop", job_id, timeout=120)
    assert stop.returncode == 0, stop.stderr[-2000:]
    wait_for(lambda: not pids_of(" -m astraflow ", str(machines))
             and not pids_of(" -m astraflow ", f"run_dir={run_dir}"), 60,
             "every component of the stopped run, and its driver, to exit")
