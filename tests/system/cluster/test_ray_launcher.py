"""``launcher=ray`` on a real Ray cluster of two Ray nodes on this machine (conftest):
two rollout pools pinned to them by resource, so which pool fed the trainer is which
Ray node did the rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from astraflow.testing import launch_run

POOLS = ("launcher.pools={a: {nodes: 1, resources: {pool_a: 1}}, "
         "b: {nodes: 1, resources: {pool_b: 1}}}")


@pytest.mark.slow
def test_two_pools_pinned_to_two_ray_nodes_both_feed_the_trainer(cluster, tmp_path):
    run_dir, machines = tmp_path / "run", tmp_path / "machines"
    launch_run(tmp_path, "launcher=ray", f"launcher.address={cluster}",
               f"launcher.work_dir={machines}", POOLS, "+experiment=smoke", "steps=6",
               f"run_dir={run_dir}",
               # each node rolls out its share of every iteration and waits for the
               # next weights, and a rollout takes half a second: once both nodes are
               # up, one cannot lease the whole iteration before the other asks
               "mode=sync", "+raas=sim", "raas.generation_seconds=0.5",
               "node_concurrency=1",
               # the trainer is a group of two ranks in its actor (torchrun, gloo)
               "trainer.world_size=2")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == 6
    fed = {pool: sum(r.get(f"pool/{pool}", 0) for r in train) for pool in ("a", "b")}
    assert fed["a"] > 0 and fed["b"] > 0, fed
    # the components worked in their machines' directories; the launcher copied the
    # logs, metric streams and final weights into the run directory over Ray, and
    # removed those directories once the run ended well
    assert (run_dir / "final" / "policy" / "config.json").exists()
    assert "registered as raas-a-0" in (run_dir / "logs" / "raas-a-0.log").read_text()
    trainer_log = (run_dir / "logs" / "trainer-policy.log").read_text()
    assert "trainer rank 1 of 2: following rank 0" in trainer_log
    assert not (run_dir / "store").exists() and not (run_dir / "checkpoints").exists()
    assert list(machines.iterdir()) == []
    # where nodes from outside the cluster join (astraflow raas --connect URL)
    assert (run_dir / "url").read_text().startswith("http://")


def test_without_ray_launcher_ray_says_what_to_install(tmp_path):
    """No Ray in the environment (a ``ray`` that cannot be imported stands for it): one
    line naming the extra, before anything starts."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "astraflow", "launcher=ray",
                           f"run_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "pip install 'astraflow[ray]'" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_a_ray_address_nobody_answers_on_is_named_at_once(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "astraflow", "launcher=ray",
                           "launcher.address=127.0.0.1:1", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "launcher.address=127.0.0.1:1: no Ray cluster answers there" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_cluster_that_refuses_the_token_is_named_at_once(cluster, tmp_path):
    """The cluster runs Ray's token authentication (conftest): a machine holding another
    token gets one line saying so, not half a minute of Ray's retries."""
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    env = {**os.environ, "RAY_AUTH_TOKEN_PATH": str(wrong)}
    proc = subprocess.run([sys.executable, "-m", "astraflow", "launcher=ray",
                           f"launcher.address={cluster}", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert (f"launcher.address={cluster}: the Ray cluster refused this machine's token"
            in proc.stderr), proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()
