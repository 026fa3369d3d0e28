"""The pids cgroup of a run (the ``cgroup-pids`` layer), and the kill that ends every
process of a run, including those that left its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path


def pids_cgroup_parent() -> Path | None:
    """Where this process may create pids cgroups (cgroup v1 or v2), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None

    paths: dict[str, str] = {}  # controller ("" for cgroup v2): this process's cgroup
    for _, controllers, path in (line.split(":", 2) for line in memberships):
        paths.update(dict.fromkeys(controllers.split(","), path.lstrip("/")))

    for _, point, fstype, options, *_ in (line.split() for line in mounts):
        v1 = fstype == "cgroup" and "pids" in options.split(",") and "pids" in paths
        if not (v1 or (fstype == "cgroup2" and "" in paths)):
            continue
        candidate = Path(point) / paths["pids" if v1 else ""]
        probe = candidate / f"astraflow-sandbox-probe-{uuid.uuid4().hex[:8]}"
        try:
            if not v1 and "pids" not in (candidate / "cgroup.subtree_control").read_text():
                continue
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        return candidate
    return None


def new_cgroup(parent: Path | None, max_processes: int) -> Path | None:
    """A fresh cgroup under ``parent`` that holds at most ``max_processes`` tasks of the
    program (and the child that relays its exit), or None without a ``parent``."""
    if parent is None:
        return None
    cgroup = parent / f"astraflow-sandbox-{uuid.uuid4().hex[:16]}"
    cgroup.mkdir()
    (cgroup / "pids.max").write_text(str(max_processes + 1))  # +1: the relay
    return cgroup


def kill(pgid: int | None, cgroup: Path | None) -> None:
    """SIGKILL to the run's process group, and to every task of its cgroup: those also
    hold the processes that left the group (setsid)."""
    pids = [-pgid] if pgid else []
    if cgroup is not None:
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


async def remove_cgroup(cgroup: Path, seconds: float = 5.0) -> None:
    """A cgroup can be removed once its last task is reaped, shortly after the kill."""
    import asyncio

    deadline = time.monotonic() + seconds
    while cgroup.exists() and time.monotonic() < deadline:
        kill(None, cgroup)
        with contextlib.suppress(OSError):
            cgroup.rmdir()
            return
        await asyncio.sleep(0.01)
