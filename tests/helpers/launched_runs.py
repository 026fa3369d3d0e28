"""Driving a real `python -m astraflow` run from a test: its processes, metrics and store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from astraflow.testing import wait_until
from astraflow.testing.runs import (  # the tests import records and pids_of from here
    pids_of,
    records,
    store_counts,
    unaccounted,
)

#: raas=sim with a small, quick job: the trainer and data layer are the real ones
SIM_RUN = ["+raas=sim", "raas.generation_seconds=0.05", "batch_size=8", "group_size=4",
           "node_concurrency=4", "launcher.progress=false",
           "dataflow.lease_seconds=6", "dataflow.heartbeat_timeout=6"]


def start_run(run_dir: Path, model_dir: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "astraflow", f"run_dir={run_dir}", f"model.path={model_dir}",
         *SIM_RUN, *overrides],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=sigint_as_at_a_terminal,
    )


def sigint_as_at_a_terminal() -> None:
    """A suite started in the background (``make test &``, a CI script) hands its
    children SIGINT ignored, and a Python started so never raises Ctrl-C: a test that
    interrupts its launcher would wait on it for ever. Its launcher gets SIGINT as a
    terminal's would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def reaped(launcher: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """The launcher is killed if the test leaves the block with it still running."""
    try:
        yield launcher
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def wait_for(condition: Callable[[], Any], timeout: float, what: str,
             launcher: subprocess.Popen | None = None) -> Any:
    return wait_until(condition, timeout, what, process=launcher, interval=0.2)


def train_records(run_dir: Path, policy: str = "policy") -> list[dict[str, Any]]:
    return records(run_dir / "metrics" / f"train-{policy}.jsonl")


def restarts(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in records(run_dir / "metrics" / "launcher.jsonl")
            if r["event"] == "restart"]


def starts(run_dir: Path, component: str) -> list[dict[str, Any]]:
    """The launcher's start events of ``component``: pid, and whether it was forked from
    the preloaded parent."""
    return [r for r in records(run_dir / "metrics" / "launcher.jsonl")
            if r["event"] == "start" and r["component"] == component]


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def kill(*needles: str) -> int:
    (pid,) = pids_of(*needles)
    os.kill(pid, signal.SIGKILL)
    return pid


def ledger(run_dir: Path, store: Path | None = None) -> dict[str, int]:
    """The data layer's durable counts, read from its store (by default the run
    directory's) after the run."""
    return store_counts(store or run_dir / "store")


def assert_nothing_lost_or_counted_twice(run_dir: Path, group_size: int,
                                         policy: str = "policy",
                                         store: Path | None = None) -> dict[str, int]:
    """Every trajectory a node got accepted is accounted for exactly once, and no task
    was completed twice.

    - each completed task produced exactly ``group_size`` trajectories and each task id
      is completed at most once (the ledger's done rows equal the completion count);
    - produced = consumed (acknowledged by the trainer) + still held (buffered or in a
      batch not yet acknowledged) + filtered + dropped as stale + dropped (no trainer).
    """
    c = ledger(run_dir, store)
    get = c.get
    assert get("tasks_completed", 0) == c["tasks_done_rows"], c
    assert get(f"produced:{policy}", 0) == group_size * get("tasks_completed", 0), c
    assert unaccounted(c, policy) == 0, c
    return c
