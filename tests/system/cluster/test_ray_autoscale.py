"""autoscale=true under ``launcher=ray``: the launcher grows a starving pool by node
actors, and when the cluster has no room for one it says so and asks the Ray autoscaler
for it (``request_resources``), which ``ray status`` shows; the request is withdrawn
when the run ends (here by Ctrl-C, once the request is seen: the run's own end goes
through the same stop)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from launched_runs import reaped, records, start_run, wait_for

#: pool a is pinned to the head, which has room for two of its nodes (pool_a: 2)
POOL = "launcher.pools={a: {nodes: 2, resources: {pool_a: 1}}}"


RAY = str(Path(sys.executable).with_name("ray"))


def ray_status(address: str) -> str:
    proc = subprocess.run([RAY, "status", f"--address={address}"], capture_output=True,
                          text=True, timeout=60, env={**os.environ})
    return proc.stdout


def test_a_pool_grown_past_the_cluster_asks_the_ray_autoscaler(cluster, tmp_path,
                                                               tiny_model_dir):
    run_dir = tmp_path / "run"
    # two slow nodes (one task in flight, 0.5 s a rollout) cannot keep the trainer busy;
    # after growing once the pool holds (cooldown), so the request stays what it was;
    # more steps than the test waits for
    launcher = start_run(run_dir, tiny_model_dir, "launcher=ray",
                         f"launcher.address={cluster}", POOL, "steps=400", "eval_every=400",
                         "batch_size=16", "num_nodes=2", "node_concurrency=1",
                         "raas.generation_seconds=0.5", "autoscale=true", "min_nodes=1",
                         "max_nodes=3", "launcher.autoscale_interval=0.5",
                         "launcher.autoscale_cooldown=120")

    def events(kind: str) -> list[dict]:
        return [r for r in records(run_dir / "metrics" / "launcher.jsonl")
                if r["event"] == kind]

    def waited(name: str) -> list[dict]:
        return [e for e in events("waiting_for_placement") if e["component"] == name]

    with reaped(launcher):
        wait_for(lambda: events("autoscale"), 240, "the pool to grow", launcher)
        # the room the run needs now: three pool-a nodes (two placed, one waiting), as
        # the cluster's status reports it (refreshed every few seconds)
        seen: list[str] = []

        def requested() -> bool:
            seen.append(ray_status(cluster))
            return any("'pool_a': 1.0" in line and ": 3 from request_resources()" in line
                       for line in seen[-1].splitlines())

        try:
            wait_for(requested, 60, "three pool-a bundles requested", launcher)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; ray status said:\n{seen[-1]}") from None
        # a component Ray is slow to start under load may be said to wait too: the one
        # that matters is the node the cluster has no room for
        wait_for(lambda: waited("raas-a-2"), 120,
                 "the launcher to say raas-a-2 waits for room", launcher)
        wait_for(lambda: (run_dir / "metrics" / "train-policy.jsonl").exists(), 120,
                 "a train step", launcher)
        launcher.send_signal(signal.SIGINT)
        _out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 130, err[-3000:]  # interrupted, every component stopped
    grown = events("autoscale")
    assert grown and grown[0]["pool"] == "a" and grown[0]["target"] == 3, grown
    assert "raas-a-2 waits for Ray to place it" in err
    assert not waited("raas-a-2")[0]["again"]
    assert events("request_resources")
    wait_for(lambda: "from request_resources()" not in ray_status(cluster), 60,
             "the request withdrawn at the end of the run")
    # the grown pool fed the trainer while it ran
    steps = [json.loads(line) for line in (run_dir / "metrics" / "train-policy.jsonl").open()]
    assert steps and steps[-1]["step"] >= 1
