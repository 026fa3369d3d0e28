"""Several policies train with no barrier between them: real processes, real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from astraflow.config import compose_config
from astraflow.launch.prepare import prepare
from astraflow.testing import wait_until

TOKEN = "multipolicy-test-token"


class Job:
    """Components started one by one, the way a user starts them on separate machines."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.url = ""

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = (self.run_dir / f"{name}.log").open("ab")
        env = dict(os.environ, ASTRAFLOW_TOKEN=TOKEN, OMP_NUM_THREADS="1")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "astraflow", *args],
                                            stdout=log, stderr=subprocess.STDOUT, env=env)
        return self.procs[name]

    def common(self) -> list[str]:
        return ["--connect", self.url, "--config", str(self.run_dir / "config.yaml"),
                "--work-dir", str(self.run_dir)]

    def status(self) -> dict:
        resp = httpx.get(f"{self.url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        return resp.json()

    def steps(self, policy: str) -> int:
        path = self.run_dir / "metrics" / f"train-{policy}.jsonl"
        return path.read_text().count("\n") if path.exists() else 0

    def close(self) -> None:
        """Nodes first, the data layer last, as the launcher stops them: a node stopped
        with the data layer finishes its leases against nobody until it gives up."""
        order = sorted(self.procs, key=lambda name: (name == "dataflow", name != "raas"))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def solve_verify_job(tmp_path, tiny_model_dir):
    cfg = compose_config(["workflow=solve_verify", "+experiment=smoke", "steps=100000",
                          f"run_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}",
                          "dataflow.heartbeat_timeout=3"])
    cfg, run_dir = prepare(cfg)
    job = Job(run_dir)
    store = run_dir / "store"
    job.spawn("dataflow", "dataflow", "--port", "0", "--store", str(store),
              "--config", str(run_dir / "config.yaml"))
    job.url = wait_until(lambda: (store / "url").exists() and (store / "url").read_text().strip(),
                    60, "the data layer")
    job.spawn("raas", "raas", *job.common())
    for policy in ("solver", "verifier"):
        job.spawn(f"trainer-{policy}", "train", *job.common(), "--policy", policy,
                  "--metrics", str(run_dir / "metrics" / f"train-{policy}.jsonl"))
    yield job
    job.close()


def test_killing_one_policys_trainer_does_not_stop_the_other(solve_verify_job):
    job = solve_verify_job
    wait_until(lambda: job.steps("verifier") >= 2 and job.steps("solver") >= 2, 300,
          "both policies to train")
    job.procs["trainer-verifier"].kill()
    job.procs["trainer-verifier"].wait()
    frozen = job.status()["versions"]["verifier"]
    # the data layer notices the silence (heartbeat_timeout=3 s); the solver, at a step
    # every ~0.2 s, may train a dozen steps before then
    wait_until(lambda: job.status()["policies"]["verifier"]["trainer_gone"], 60,
          "the verifier's trainer to be declared gone")
    solver_at_gone = job.status()["versions"]["solver"]
    # well past the verifier's staleness budget: its queue would have stopped all rollouts
    wait_until(lambda: job.status()["versions"]["solver"] >= solver_at_gone + 12, 300,
          "the solver to keep training")
    status = job.status()
    assert status["versions"]["verifier"] == frozen
    assert status["policies"]["verifier"]["trainer_gone"] is True
    assert status["policies"]["solver"]["trainer_gone"] is False
    # one policy is many versions ahead of the other: nothing couples them
    assert status["versions"]["solver"] - status["versions"]["verifier"] >= 10


def test_each_policy_trains_only_on_its_own_tokens(solve_verify_job):
    job = solve_verify_job
    wait_until(lambda: job.steps("verifier") >= 3 and job.steps("solver") >= 3, 300,
          "both policies to train")
    records = {p: [json.loads(line) for line in
                   (job.run_dir / "metrics" / f"train-{p}.jsonl").read_text().splitlines()]
               for p in ("solver", "verifier")}
    for policy, recs in records.items():
        assert all(r["policy"] == policy for r in recs)
        assert [r["version"] for r in recs] == sorted(r["version"] for r in recs)
