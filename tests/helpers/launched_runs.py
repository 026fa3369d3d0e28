"""Driving a real `python -m astraflow` run from a test: its processes, metrics and store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from astraflow.testing import wait_until

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


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # being written
    return out


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


def pids_of(*needles: str) -> list[int]:
    """Processes whose command line holds every needle."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(n in text for n in needles):
            found.append(int(cmdline.parent.name))
    return found


def kill(*needles: str) -> int:
    (pid,) = pids_of(*needles)
    os.kill(pid, signal.SIGKILL)
    return pid


def ledger(run_dir: Path, store: Path | None = None) -> dict[str, int]:
    """The data layer's durable counts, read from its store (by default the run
    directory's) after the run."""
    with sqlite3.connect((store or run_dir / "store") / "dataflow.sqlite3") as conn:
        counts = dict(conn.execute("SELECT name, value FROM counters"))
        counts["items_held"] = conn.execute("SELECT COUNT(*) FROM items").fetchone()[0]
        counts["tasks_done_rows"] = conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE state = 'done'").fetchone()[0]
    return counts


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
    accounted = (get(f"consumed:{policy}", 0) + c["items_held"] + get(f"filtered:{policy}", 0)
                 + get(f"dropped_stale:{policy}", 0) + get(f"dropped_no_trainer:{policy}", 0))
    assert get(f"produced:{policy}", 0) == accounted, c
    return c
