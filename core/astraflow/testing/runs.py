"""Reading a ``python -m astraflow`` run from outside, as its tests and benchmarks do: its
metrics files (while they are written), its processes, and the counters of its store.

Torch-free and dependency-free: a benchmark script imports it as readily as a test.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any


def records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines metrics file; none if it does not exist yet, and not
    the last line while it is being written."""
    out: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


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


def children(pid: int) -> list[int]:
    """The direct children of a process (none once it is gone)."""
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(p) for p in found]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def store_counts(store: Path) -> dict[str, Any]:
    """The data layer's durable counters (``produced:<policy>``, ``consumed:<policy>``,
    ``tasks_completed``, ...) from a store directory, with what its tables hold:
    ``items_held`` (trajectories buffered or in an unacknowledged batch),
    ``held:<policy>`` (the same, per policy) and ``tasks_done_rows``."""
    with sqlite3.connect(store / "dataflow.sqlite3") as conn:
        counts: dict[str, Any] = dict(conn.execute("SELECT name, value FROM counters"))
        held = dict(conn.execute("SELECT policy, COUNT(*) FROM items GROUP BY policy"))
        counts["tasks_done_rows"] = conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE state = 'done'").fetchone()[0]
    counts["items_held"] = sum(held.values())
    counts.update({f"held:{policy}": n for policy, n in held.items()})
    return counts


def unaccounted(counts: dict[str, Any], policy: str) -> int:
    """Trajectories of ``policy`` the store counts produced but not trained, held,
    filtered, dropped as stale or dropped for want of a trainer: 0 when nothing was
    lost (negative: something counted twice)."""
    get = counts.get
    return get(f"produced:{policy}", 0) - (
        get(f"consumed:{policy}", 0) + get(f"held:{policy}", 0) + get(f"filtered:{policy}", 0)
        + get(f"dropped_stale:{policy}", 0) + get(f"dropped_no_trainer:{policy}", 0))
