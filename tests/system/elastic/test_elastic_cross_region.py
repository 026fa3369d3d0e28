"""A remote pool behind a slow, high-latency link (150 ms each way, 50 Mbit/s) pulls
weights and uploads trajectories through it: it contributes to every iteration and the
trainer waits no longer per step than in the same run without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launched_runs import ledger, start_run, train_records, wait_for
from shaped_link import ShapedLink

TOKEN = "cross-region-token"
STEPS = 12
BATCH = 32
RUN = [f"steps={STEPS}", f"eval_every={STEPS}", f"batch_size={BATCH}", "num_nodes=1",
       "node_concurrency=2", "raas.generation_seconds=0.5", "policies.policy.max_staleness=4"]
#: the stated bound: mean trainer wait per step with the remote pool, relative to the
#: local-only run (a remote pool may add capacity; it must never hold the trainer back)
WAIT_BOUND = 1.10


def _run(run_dir: Path, model: str, link: ShapedLink, remote: bool) -> list[dict]:
    launcher = start_run(run_dir, model, *RUN, f"dataflow.host={link.host_ip}")
    try:
        url = wait_for(lambda: (run_dir / "store" / "url").exists()
                       and (run_dir / "store" / "url").read_text().strip(), 120,
                       "the data layer", launcher)
        if remote:
            port = int(url.rsplit(":", 1)[1])
            link.popen([sys.executable, "-m", "astraflow", "raas", "--connect", link.url(port),
                        "--config", str(run_dir / "config.yaml"), "--work-dir",
                        str(run_dir.parent / "remote"), "--name", "remote-0", "--pool",
                        "remote", "--region", "far", "--concurrency", "4"],
                       env=dict(os.environ, ASTRAFLOW_TOKEN=TOKEN, OMP_NUM_THREADS="1"),
                       stdout=(run_dir.parent / "remote.log").open("w"),
                       stderr=subprocess.STDOUT)
        _out, err = launcher.communicate(timeout=400)
        assert launcher.returncode == 0, err[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return train_records(run_dir)


def test_remote_pool_behind_a_shaped_link_feeds_every_iteration(tmp_path, tiny_model_dir,
                                                                monkeypatch):
    monkeypatch.setenv("ASTRAFLOW_TOKEN", TOKEN)
    with ShapedLink(delay_ms=150, rate="50mbit") as link:
        local = _run(tmp_path / "local", tiny_model_dir, link, remote=False)
        both = _run(tmp_path / "both", tiny_model_dir, link, remote=True)
    remote_log = (tmp_path / "remote.log").read_text()
    assert "registered as raas-remote-0" in remote_log, remote_log[-2000:]
    assert remote_log.count("now at version") >= 2  # weight pulls crossed the link
    # the trainer records which pools fed each step: from the first step the remote pool
    # fed, it feeds every one
    fed = [r["step"] for r in both if r.get("pool/remote", 0) > 0]
    assert fed, [{k: v for k, v in r.items() if k.startswith("pool/")} for r in both]
    batches = list(range(fed[0], STEPS + 1))
    assert len(batches) >= 3 and fed == batches, (fed, [r.get("pool/remote") for r in both])
    # and no step trained on a sample older than the staleness bound, remote or not
    assert max(r["staleness_max"] for r in both) <= 4, [r["staleness_max"] for r in both]
    steps = [r for r in both if r["step"] >= batches[0]]
    wait_local = sum(r["wait_seconds"] for r in local[1:]) / len(local[1:])
    wait_both = sum(r["wait_seconds"] for r in steps) / len(steps)
    counts = ledger(tmp_path / "both")
    dropped = counts.get("dropped_stale:policy", 0)
    # every stale drop is put down to the pool that produced it
    by_pool = {json.loads(k.split(":", 1)[1])[1]: n for k, n in counts.items()
               if k.startswith("dropped_stale_pool:")}
    assert sum(by_pool.values()) == dropped, (by_pool, dropped)
    print(f"cross-region ({link.shaping}): steps {batches[0]}..{STEPS} each held remote "
          f"trajectories; trainer wait per step {wait_both:.3f} s with the remote pool, "
          f"{wait_local:.3f} s local-only; {dropped} samples dropped as stale {by_pool}")
    assert wait_both <= WAIT_BOUND * wait_local
