"""The data layer's disk fills up: every write is refused with a 507 that says so, what
was acknowledged before stays, and once space returns the same requests go through --
the run goes on, and a restart finds exactly what was acknowledged.

The store lies on a small tmpfs mounted for the test; a ballast file fills it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from dataflow_helpers import TOKEN, make_trajectory

from astraflow.dataflow.client import DataflowClient, DataflowError
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.types import Task

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(mount: Path, leave: int) -> Path:
    """A ballast file that leaves ``leave`` bytes free on ``mount``."""
    ballast = mount / "ballast"
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with ballast.open("ab") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return ballast


def _group(lease, tokens: int = 1500):
    """A group of two ~10 KB trajectories, each sample named TASK/K."""
    tid = lease.task.task_id
    trajs = [make_trajectory(tid, reward=float(k), gen_len=tokens) for k in range(2)]
    for k, traj in enumerate(trajs):
        traj.metadata["sample"] = f"{tid}/{k}"
    return trajs


def _says_disk_full(refused: DataflowError) -> None:
    assert refused.status == 507, refused
    assert "disk full" in str(refused) and "retry once space returns" in str(refused)


def _refused_or_done(call) -> bool:
    """True if ``call`` went through; False if it was refused, as a full disk."""
    try:
        call()
    except DataflowError as refused:
        _says_disk_full(refused)
        return False
    return True


def test_a_full_disk_refuses_writes_loses_nothing_and_the_run_goes_on(small_disk):
    settings = DataflowSettings(store=str(small_disk / "store"), policies={"policy": 1000},
                                group_size=2, batch_size=4, buffer_capacity=100_000)
    with BackgroundServer(settings, TOKEN) as server:
        c = DataflowClient(server.url, TOKEN, retry_for=0)
        c.register("raas", node_id="node-1")
        c.post_tasks([Task(f"t{i}", "p") for i in range(400)])
        for lease in c.lease_tasks(max_tasks=2):
            assert c.submit(lease, _group(lease))["status"] == "accepted"
        held = c.get_batch("policy", 4, timeout=5, trainer_id="trainer")
        assert held is not None

        ballast = _fill(small_disk, leave=256 * 1024)
        accepted: set[str] = {i.trajectory.metadata["sample"] for i in held.items}
        refused = None
        for _ in range(200):
            (lease,) = c.lease_tasks()
            try:
                c.submit(lease, trajs := _group(lease))
            except DataflowError as exc:
                refused = (lease, trajs, exc)
                break
            accepted |= {t.metadata["sample"] for t in trajs}
        assert refused is not None, "the disk never filled"
        lease, trajs, exc = refused
        assert exc.status == 507 and "disk full" in str(exc), exc
        # the last bytes taken too: a write that needs new space is refused alike, one
        # SQLite makes in the pages its write-ahead log already holds (it reuses them
        # after a checkpoint) goes through -- either way it is said, never lost
        _fill(small_disk, leave=0)
        acked = _refused_or_done(lambda: c.ack_batch(held.batch_id))
        announced = _refused_or_done(lambda: c.announce_version("policy", 1))
        assert c.status()["versions"]["policy"] == (1 if announced else 0)  # reading goes on

        ballast.unlink()  # space returns: the same requests go through
        assert c.submit(lease, trajs)["status"] == "accepted"
        accepted |= {t.metadata["sample"] for t in trajs}
        assert c.ack_batch(held.batch_id)["status"] == ("duplicate" if acked else "acked")
        assert c.announce_version("policy", 1)["version"] == 1
        c.close()

    # a restart finds exactly what was acknowledged: the acked batch is not served
    # again, every other accepted sample is served once, the version holds
    with BackgroundServer(settings, TOKEN) as server:
        c = DataflowClient(server.url, TOKEN, retry_for=0)
        assert c.status()["versions"]["policy"] == 1
        served: list[str] = []
        while (batch := c.get_batch("policy", 2, timeout=0.2, trainer_id="after")) is not None:
            served += [i.trajectory.metadata["sample"] for i in batch.items]
            c.ack_batch(batch.batch_id)
        held_samples = {i.trajectory.metadata["sample"] for i in held.items}
        assert len(served) == len(set(served))
        assert set(served) == accepted - held_samples
        st = c.status()["trajectories"]
        assert st["accepted"] == len(accepted) and st["consumed"] == len(accepted)
        c.close()
