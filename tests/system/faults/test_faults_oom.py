"""A component the kernel's OOM killer ends is said to be, once, with its peak memory,
and is not restarted into the same death.

The run is started in a memory cgroup of its own; once it works, the cgroup gets a
limit a little above what the run holds, and the node's reward (a file of the test's)
starts keeping 32 MiB of every sample it scores: the node grows into the limit and the
kernel kills it -- a real OOM kill, counted in the cgroup's ``oom_kill``, as a real
model's trainer was killed at 19.7 GB. Where this process cannot make a memory cgroup
(no root, no writable cgroup v1 memory hierarchy, or cgroup v2 without the memory
controller delegated), the test is skipped saying so; the verdict itself is unit-tested
on count files (tests/unit/core/test_core_memory.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import launched_runs as runs
import pytest

from astraflow.launch.memory import memory_cgroup

pytestmark = pytest.mark.timeout(300)

#: what the run may hold beyond what it held when it got to work
HEADROOM = 768 << 20

REWARD = '''
import os, sys

KEPT = []


def score(task, completion):
    """Scores like exact_match; in the node, once told to, keeps 32 MiB a sample."""
    if "raas" in sys.argv and os.path.exists({flag!r}):
        KEPT.append(b"\\x01" * (32 << 20))  # written, so charged to the cgroup
    return float(completion.strip() == str(task.answer))
'''


def make_cgroup() -> tuple[Path, str]:
    """A fresh memory cgroup under this process's, and the name of its limit file."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    mine = memory_cgroup()
    if mine is None:
        pytest.skip("no memory cgroup found for this process")
    if mine.version == 2:
        try:
            delegated = "memory" in (mine.path / "cgroup.subtree_control").read_text()
        except OSError:
            delegated = False
        if not delegated:
            pytest.skip(f"cgroup v2: {mine.path} does not delegate the memory controller")
    path = mine.path / f"astraflow-oom-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup under {mine.path}: {exc}")
    return path, ("memory.max" if mine.version == 2 else "memory.limit_in_bytes")


@pytest.fixture
def cgroup() -> Iterator[tuple[Path, str]]:
    path, limit = make_cgroup()
    try:
        yield path, limit
    finally:
        deadline = time.monotonic() + 30
        while path.exists():
            try:
                for pid in (path / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                path.rmdir()
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def usage(path: Path) -> int:
    for name in ("memory.current", "memory.usage_in_bytes"):
        if (path / name).exists():
            return int((path / name).read_text())
    raise AssertionError(f"{path}: no usage file")


def test_an_oom_killed_node_is_said_once_and_not_restarted(tmp_path, tiny_model_dir, cgroup):
    path, limit_file = cgroup
    flag = tmp_path / "grow"
    reward = tmp_path / "growing_reward.py"
    reward.write_text(REWARD.format(flag=str(flag)))
    run_dir = tmp_path / "run"

    def into_cgroup() -> None:  # the launcher, and so every component, in the cgroup
        runs.sigint_as_at_a_terminal()
        (path / "cgroup.procs").write_text(str(os.getpid()))

    launcher = subprocess.Popen(
        [sys.executable, "-m", "astraflow", f"run_dir={run_dir}",
         f"model.path={tiny_model_dir}", *runs.SIM_RUN, "steps=100000",
         "reward=python", f"reward.path={reward}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=into_cgroup)
    with runs.reaped(launcher):
        runs.wait_for(lambda: runs.train_records(run_dir), 240, "a trainer step", launcher)
        runs.wait_for(lambda: (run_dir / "logs" / "raas-0.ready").exists(), 60,
                      "the node at work", launcher)
        (path / limit_file).write_text(str(usage(path) + HEADROOM))
        flag.touch()
        _out, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 1, err[-3000:]

    said = [line for line in err.splitlines() if "OOM killer" in line]
    assert len(said) == 1, err[-3000:]
    assert said[0].startswith("astraflow: error: raas-0 was killed by the kernel's OOM "
                              "killer at a peak of "), said
    # the limit that bound it: the cgroup's, set while the run went on
    assert f"(its cgroup ({limit_file} of {path}) allows " in said[0], said
    assert "it is not restarted, as it would die the same way" in said[0]
    assert str(run_dir / "logs" / "raas-0.log") in said[0]
    assert "restarting it" not in err
    events = runs.records(run_dir / "metrics" / "launcher.jsonl")
    (killed,) = [e for e in events if e["event"] == "oom_kill"]
    assert (killed["component"], killed["exit_code"], killed["verdict"]) == ("raas-0", -9, "oom")
    assert "oom_kill" in killed["evidence"]
    # what the node held when it died: at least what it had grown by
    assert killed["peak_bytes"] >= HEADROOM // 2
    assert not [e for e in events if e["event"] == "restart"]
    assert len(runs.starts(run_dir, "raas-0")) == 1
    assert not runs.pids_of(f"--work-dir {run_dir} ")  # everything else was stopped


class _NoRay:
    """``ray.remote`` as the identity: the component actor's class, run in this process."""

    @staticmethod
    def remote(cls: type) -> type:
        return cls


@pytest.mark.parametrize("oom_killed", [True, False])
def test_a_ray_actor_keeps_an_oom_killed_component_down(tmp_path, monkeypatch, oom_killed):
    """launcher=ray: the actor that owns a component, without a cluster. A component
    killed after it got to work makes the actor exit, and Ray restart both -- unless
    the OOM killer killed it: then the actor stays, and its poll tells the launcher why,
    which stops the run (RayRun.supervise). The kill here is a SIGKILL, and the OOM
    count one the test writes (not the kernel's) standing for the machine's."""
    from astraflow.launch.oom import OomCount
    from astraflow.launch.ray_actor import component_actor

    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)  # the actor's exit, which Ray sees
    count = tmp_path / "vmstat"
    count.write_text("oom_kill 0\n")
    actor = component_actor(_NoRay)("dataflow", ["dataflow", "--store", "{work}/store"],
                                    {}, str(tmp_path / "work"), "{}\n")
    actor.memory.count = OomCount(count, "machine")
    actor.memory.history.clear()
    try:
        runs.wait_for(lambda: (tmp_path / "work" / "dataflow" / "store" / "url").exists(),
                      60, "the data layer listening")
        Path(actor.ready).touch()  # it got to work
        if oom_killed:
            count.write_text("oom_kill 1000000\n")
        os.kill(actor.proc.pid, signal.SIGKILL)
        code, _pid, worked, oom = runs.wait_for(
            lambda: (answer := actor.poll())[0] is not None and answer, 30, "its death")
    finally:
        if actor.proc.poll() is None:
            actor.proc.kill()
    assert (code, worked) == (-9, True)
    if oom_killed:
        assert exits == [] and oom.verdict == "oom"
        assert oom.said("dataflow", Path("dataflow.log")).startswith(
            "dataflow was killed by the kernel's OOM killer at a peak of ")
    else:
        runs.wait_for(lambda: exits, 10, "the actor's exit")
        assert exits == [1] and oom is None
