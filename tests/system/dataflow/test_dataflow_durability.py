"""SIGKILL the service mid-stream, restart it on the same store: nothing acknowledged is
lost, nothing is counted twice, and clients carry on by themselves."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from dataflow_helpers import TOKEN, group, start_service, wait_until

from astraflow.dataflow.client import DataflowClient

GROUP = 4


def _start(store: Path, port: int) -> tuple[subprocess.Popen, str]:
    return start_service(
        [sys.executable, "-m", "astraflow", "dataflow", "--host", "127.0.0.1",
         "--port", str(port), "--store", str(store), "--task", "arithmetic",
         "--group-size", str(GROUP), "--batch-size", "8", "--lease-seconds", "30",
         "--policy", "policy=1000", "--buffer-capacity", "100000"], store / "url")


def _producer(url: str, acknowledged: dict[str, set[str]], stop: threading.Event) -> None:
    """A RaaS node: lease, submit, remember what the service acknowledged."""
    with DataflowClient(url, TOKEN, retry_for=60) as node:
        node.register("raas", pool="p")
        while not stop.is_set():
            for lease in node.lease_tasks(max_tasks=2):
                tid = lease.task.task_id
                trajs = group(tid, [0.0, 1.0, 1.0, 0.0], gen_len=64)
                for k, t in enumerate(trajs):
                    t.metadata["sample"] = f"{tid}/{k}"
                out = node.submit(lease, trajs)
                # "duplicate" here means an attempt cut off by the kill had been committed
                assert out["status"] in ("accepted", "duplicate")
                acknowledged[tid] = {t.metadata["sample"] for t in trajs}


def test_sigkill_and_restart_lose_and_double_count_nothing(tmp_path):
    store = tmp_path / "store"
    proc, url = _start(store, 0)
    port = int(url.rsplit(":", 1)[1])
    acknowledged: dict[str, set[str]] = {}
    stop = threading.Event()
    producer = threading.Thread(target=_producer, args=(url, acknowledged, stop))
    trainer = DataflowClient(url, TOKEN, retry_for=60)
    try:
        producer.start()
        wait_until(lambda: len(acknowledged) >= 12, 30, "a first wave of submissions")
        consumed: set[str] = set()
        acked = trainer.get_batch("policy", 8, timeout=10, trainer_id="t0")
        # acknowledged without a step's timing: a trainer pace known, admission would stop
        # issuing once what is queued covers it, and the stream must run on through the kill
        trainer.ack_batch(acked.batch_id)
        consumed |= {i.trajectory.metadata["sample"] for i in acked.items}
        pending = trainer.get_batch("policy", 8, timeout=10, trainer_id="t0")  # never acked
        wait_until(lambda: len(acknowledged) >= 20, 30, "more submissions")

        proc.send_signal(signal.SIGKILL)  # mid-stream: the producer is still submitting
        proc.wait()
        proc, url2 = _start(store, port)
        assert url2 == url
        wait_until(lambda: len(acknowledged) >= 30, 60, "the producer to carry on by itself")
        stop.set()
        producer.join(60)
        assert not producer.is_alive()

        st = trainer.status()
        accepted = set().union(*acknowledged.values())
        assert st["tasks"]["completed"] == len(acknowledged)
        assert st["trajectories"]["accepted"] == len(accepted) == GROUP * len(acknowledged)
        assert st["trajectories"]["consumed"] == 8
        assert st["trajectories"]["lost"] == 0  # every payload checked out after the kill

        # the unacknowledged batch comes back first, then everything else exactly once
        again = trainer.get_batch("policy", 8, timeout=10, trainer_id="t0")
        assert again.batch_id == pending.batch_id
        served = [i.trajectory.metadata["sample"] for i in again.items]
        trainer.ack_batch(again.batch_id)
        remaining = st["policies"]["policy"]["buffered"]
        rest = trainer.get_batch("policy", remaining, timeout=10, trainer_id="t0")
        served += [i.trajectory.metadata["sample"] for i in rest.items]
        assert len(served) == len(set(served))
        assert consumed.isdisjoint(served)
        assert consumed | set(served) == accepted

        # a node replaying an old submission after the restart is told "duplicate"
        old = next(iter(acknowledged))
        assert trainer.submit(f"{old}|1", group(old, [0.0, 1.0, 1.0, 0.0]))["status"] == \
            "duplicate"
        assert trainer.status()["trajectories"]["accepted"] == len(accepted)
    finally:
        stop.set()
        trainer.close()
        proc.kill()
        proc.wait()
