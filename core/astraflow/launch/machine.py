"""The machine's memory as a run sees it: MemTotal, or a memory cgroup's limit if lower.

Read by the memory estimate (:mod:`.memory`) and the OOM-kill verdict (:mod:`.oom`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemoryCgroup:
    """The launcher's memory cgroup: its directory, the hierarchy's root, its version."""

    path: Path
    root: Path
    version: int

    def ancestors(self) -> Iterable[Path]:
        """Its directory and each parent up to the hierarchy's root."""
        path = self.path
        while True:
            yield path
            if path == self.root or self.root not in path.parents:
                return
            path = path.parent

    @property
    def events(self) -> Path:
        """The file that counts OOM kills in it (``oom_kill``)."""
        return self.path / ("memory.events" if self.version == 2 else "memory.oom_control")


def memory_cgroup(proc: Path = Path("/proc/self")) -> MemoryCgroup | None:
    """The memory cgroup ``proc`` is in (cgroup v2, or v1's memory controller), found
    from ``/proc/self/cgroup`` and the mounts; None when neither is readable."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mounts").read_text().splitlines()
    except OSError:
        return None
    paths: dict[str, str] = {}  # controller ("" for cgroup v2) -> cgroup path
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.update(dict.fromkeys(parts[1].split(","), parts[2]))
    found = []
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup2" and "" in paths:
            found.append((Path(point), paths[""], 2))
        elif fstype == "cgroup" and "memory" in options and "memory" in paths:
            found.append((Path(point), paths["memory"], 1))
    for root, rel, version in sorted(found, key=lambda f: -f[2]):  # v2 first
        path = root / rel.lstrip("/")
        if not path.is_dir():  # a cgroup namespace: the mount is the process's own
            path = root
        cgroup = MemoryCgroup(path, root, version)
        if cgroup.events.exists():
            return cgroup
    return None


def _limit(path: Path, version: int) -> int | None:
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    try:
        text = (path / name).read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max"
    value = int(text)
    return value if value < 1 << 60 else None  # v1's "unlimited" is a page-rounded 2^63


def machine_memory(cgroup: MemoryCgroup | bool | None = True,
                   meminfo: Path = Path("/proc/meminfo")) -> tuple[int, str]:
    """The memory this run may use, and what sets it: the machine's ``MemTotal``, or its
    cgroup's limit (``memory.max``; v1 ``memory.limit_in_bytes``, its own or an
    ancestor's) when lower."""
    total = 0
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if cgroup is True:
        cgroup = memory_cgroup()
    best, where = total, "this machine"
    if isinstance(cgroup, MemoryCgroup):
        for path in cgroup.ancestors():
            limit = _limit(path, cgroup.version)
            if limit is not None and (not best or limit < best):
                key = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
                best, where = limit, f"its cgroup ({key} of {path})"
    return best, where
