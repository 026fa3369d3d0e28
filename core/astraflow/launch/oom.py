"""What each component of a local run took at its peak, and whether the kernel's OOM
killer ended one.

The launcher's monitor loop samples each component's resident memory, summed over its
process tree (an engine's own processes included), from ``/proc`` twice a second, and
reaps a component with ``wait4``, whose ``ru_maxrss`` is the process's own peak however
fast it grew before it died. A component that died of SIGKILL while the kernel's count
of OOM kills went up -- the launcher's memory cgroup's ``oom_kill`` (cgroup v2
``memory.events``, v1 ``memory.oom_control``), else the machine's in ``/proc/vmstat`` --
was killed by the OOM killer: restarted, it would grow into the same death, so the run
stops with one line that says so and what it took. Where no count can be read, a
SIGKILL of a component that held at least half of the memory is said to be *likely*
the OOM killer's, and is not restarted either.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraflow.launch.memory import available, gib, machine_memory, memory_cgroup

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: a SIGKILL is the OOM killer's when the count went up within this many seconds before
#: the launcher saw the component dead (a large process takes a while to exit)
WINDOW = 10.0
#: without a count: a SIGKILL of a component that held this fraction of the memory is
#: said to be likely the OOM killer's
LIKELY_FRACTION = 0.5
#: the settings that lower a component's memory, by the start of its name
ADVICE = {
    "trainer-": "lower trainer.micro_batch_size, use trainer.lora.rank=16 or "
                "trainer.dtype=bfloat16",
    "raas-": "lower num_nodes, node_concurrency or raas.max_batch_size",
    "eval-": "set eval_deferred=true or lower raas.max_batch_size",
    "dataflow": "lower dataflow.buffer_capacity",
}


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/PID/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError, ValueError), \
                    open(f"/proc/{current}/task/{task}/children") as fh:
                todo.extend(int(p) for p in fh.read().split())
    return out


def resident(pid: int) -> int:
    """Bytes ``pid`` holds in memory now (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def tree_resident(pid: int) -> int:
    """Bytes a process and its descendants hold now (pages they share count in each)."""
    return sum(resident(p) for p in tree(pid))


def reap(proc: Any) -> tuple[int | None, int]:
    """``proc.poll()`` (a :class:`subprocess.Popen` or a forked process of the launcher's)
    that also returns the peak resident bytes of a process it reaps (``wait4``'s
    ``ru_maxrss``; 0 when it is still running or was reaped before)."""
    if proc.returncode is not None:
        return proc.returncode, 0
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # not this process's child (reaped elsewhere)
        return proc.poll(), 0
    if not pid:
        return None, 0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024


def reap_blocking(proc: Any) -> tuple[int, int]:
    """Wait for ``proc`` (a :class:`subprocess.Popen`) to exit: its exit code and its peak
    resident bytes (0 when something else reaped it first)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        return proc.wait(), 0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024


@dataclass
class OomCount:
    """The kernel's count of OOM kills in a file (``oom_kill N`` lines): the launcher's
    memory cgroup's, or the machine's."""

    path: Path
    #: what it counts, for the run's events: "cgroup" or "machine"
    scope: str

    @classmethod
    def find(cls) -> OomCount | None:
        cgroup = memory_cgroup()
        if cgroup is not None:
            found = cls(cgroup.events, "cgroup")
            if found.read() is not None:
                return found
        machine = cls(Path("/proc/vmstat"), "machine")
        return machine if machine.read() is not None else None

    def read(self) -> int | None:
        try:
            text = self.path.read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return None


@dataclass(frozen=True)
class Death:
    """Why a component that died with SIGKILL did: the OOM killer (``oom``), likely it
    (``likely``: no count to tell), and what it took."""

    verdict: str
    peak: int
    limit: int
    where: str
    evidence: str

    def said(self, name: str, log: Path) -> str:
        advice = next((a for prefix, a in ADVICE.items() if name.startswith(prefix)),
                      "lower its memory")
        has = available(self.limit, self.where) if self.limit else "the memory is unknown"
        if self.verdict == "oom":
            what = (f"{name} was killed by the kernel's OOM killer at a peak of "
                    f"{gib(self.peak)} ({has})")
        else:
            what = (f"{name} was killed by SIGKILL (likely the kernel's OOM killer: peak "
                    f"{gib(self.peak)}; {has})")
        return (f"{what}; it is not restarted, as it would die the same way: {advice}; "
                f"see {log}")


@dataclass
class MemoryWatch:
    """Peaks of the launcher's components and the count of OOM kills, read each time
    the launcher looks at its components (:meth:`tick`)."""

    count: OomCount | None = field(default_factory=OomCount.find)
    #: the memory the run may use, and what sets it (None: read when a component dies,
    #: as a cgroup's limit may change while the run goes on)
    limit: tuple[int, str] | None = None
    #: (time, count) as read at each tick within :data:`WINDOW`
    history: deque[tuple[float, int]] = field(default_factory=deque)
    #: when a SIGKILL was put down to the OOM killer (each takes one kill of the count)
    taken: list[float] = field(default_factory=list)
    #: component -> the peak of its current (or last) life
    peaks: dict[str, int] = field(default_factory=dict)
    #: component -> the highest peak of any of its lives
    highest: dict[str, int] = field(default_factory=dict)

    def tick(self) -> None:
        if self.count is None:
            return
        value = self.count.read()
        if value is None:
            return
        now = time.monotonic()
        self.history.append((now, value))
        while len(self.history) > 1 and now - self.history[1][0] > WINDOW:
            self.history.popleft()

    def started(self, name: str) -> None:
        """A new life of ``name``: its peak starts again."""
        self.peaks[name] = 0

    def sample(self, name: str, pid: int) -> int:
        """The resident bytes of ``pid``'s tree now, kept as ``name``'s peak if higher."""
        now = tree_resident(pid)
        self.exited(name, now)
        return now

    def exited(self, name: str, peak: int) -> None:
        """``name``'s peak is at least ``peak`` (as the kernel kept it when it was
        reaped, or as sampled)."""
        self.peaks[name] = max(self.peaks.get(name, 0), peak)
        self.highest[name] = max(self.highest.get(name, 0), peak)

    def death(self, name: str, code: int, peak: int) -> Death | None:
        """Whether a component that exited with ``code`` after a life that peaked at
        ``peak`` bytes was killed by the OOM killer (or likely was), else None."""
        if code != -9:
            return None
        limit, where = self.limit or machine_memory()
        now = time.monotonic()
        value = self.count.read() if self.count is not None else None
        if self.count is not None and value is not None:
            base = self.history[0][1] if self.history else value
            since = self.history[0][0] if self.history else now
            taken = sum(1 for t in self.taken if t >= since)
            if value - base - taken <= 0:
                return None
            self.taken.append(now)
            return Death("oom", peak, limit, where,
                         f"{self.count.path} oom_kill {base} -> {value}")
        if limit and peak >= LIKELY_FRACTION * limit:
            return Death("likely", peak, limit, where, "no OOM kill count readable")
        return None
