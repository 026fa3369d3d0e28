"""Trajectory payloads in append-only segment files; the SQLite ledger says where each is.

A trajectory's stored form (msgpack, ~13 KB for 1k tokens) is written once, here,
instead of through SQLite, where WAL mode writes every byte twice (into the WAL at
commit, into the database at checkpoint) and splits it over overflow pages. The
ledger row keeps the location ``(segment, offset, length, crc32)``.

Ordering is what keeps this durable. A submission appends its payloads before its
ledger rows are committed, so a committed row always points at bytes already handed
to the OS, and a SIGKILL loses nothing the service acknowledged. With
``synchronous=FULL`` the store fsyncs the active segment before every commit, so a
power cut loses nothing either. With ``NORMAL``, as with SQLite's own ``NORMAL``,
nothing is fsynced on the way (an fsync per 64 MB segment measurably slows ingest), so
a power cut may lose the newest writes. A clean shutdown fsyncs everything; after any
other, the service checks every buffered payload against its checksum when it starts
(``recovering``) and drops, and counts as ``lost``, any it cannot read.

Segments are reclaimed whole: each keeps a count of the rows that point into it
(committed or about to be), and a segment is deleted when that reaches zero and it is
no longer the one being appended to. Bytes appended for a commit that failed are
never referenced and go with their segment. The active segment is ``N.open``; when it
reaches ``segment_bytes`` it is renamed ``N.seg`` and the next one starts. A ``.open``
file at start-up means the previous process did not shut down cleanly.
"""

from __future__ import annotations

import errno
import os
import threading
import zlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

#: a segment is sealed once it holds this much
SEGMENT_BYTES = 64 * 1024 * 1024

#: buffers one writev may take (Linux's IOV_MAX)
_IOV_MAX = 1024

#: where a payload lies: (segment, offset, length, crc32)
Location = tuple[int, int, int, int]


class PayloadCorrupt(OSError):
    """A payload whose bytes are missing or fail their checksum."""


class DiskFull(OSError):
    """The store's filesystem has no space left (or the quota is spent): nothing was
    written, and the same write may be made again once space returns."""


#: what a write to a full filesystem fails with
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class PayloadLog:
    """The segment files under one directory; use from one event loop (sync is thread-safe)."""

    def __init__(self, directory: Path, segment_bytes: int | None = None,
                 first: int = 0) -> None:
        """``first``: the lowest number the segment appended to may take (past every
        segment the ledger points into, so one gone from the disk is never taken for
        the new one)."""
        self.directory = directory
        self.segment_bytes = segment_bytes or SEGMENT_BYTES
        directory.mkdir(parents=True, exist_ok=True)
        found = self.segments_on_disk()
        #: the previous process did not close the log: check payloads before trusting them
        self.recovering = any(path.suffix == ".open" for path in found.values())
        self.active = max(max(found, default=-1) + 1, first)
        #: guards the active segment's descriptor (``sync`` runs on the store's writer)
        self._lock = threading.Lock()
        self._fd = self._create(self.active)
        self._size = 0
        self._dirty = False
        #: sealed segments written since start-up and not yet fsynced
        self._unsynced: set[int] = set()
        self._readers: dict[int, int] = {}
        #: rows pointing into each segment (committed, or appended for a pending commit)
        self.refs: Counter[int] = Counter()

    # ---- files -----------------------------------------------------------------------

    def _path(self, segment: int, sealed: bool) -> Path:
        return self.directory / f"{segment:08d}.{'seg' if sealed else 'open'}"

    def _create(self, segment: int) -> int:
        return os.open(self._path(segment, False), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)

    def segments_on_disk(self) -> dict[int, Path]:
        out = {}
        for path in self.directory.iterdir():
            if path.suffix in (".seg", ".open") and path.stem.isdigit():
                out[int(path.stem)] = path
        return out

    def _reader(self, segment: int) -> int:
        fd = self._readers.get(segment)
        if fd is None:
            for sealed in (True, False):
                try:
                    fd = os.open(self._path(segment, sealed), os.O_RDONLY)
                    break
                except FileNotFoundError:
                    continue
            else:
                raise PayloadCorrupt(f"payload segment {segment} is missing")
            self._readers[segment] = fd
        return fd

    # ---- writing ---------------------------------------------------------------------

    def append(self, payloads: list[bytes]) -> list[Location]:
        """Write ``payloads`` (one writev call) and hold a reference to each for its row.

        The caller commits rows naming the returned locations, or calls :meth:`release`
        with them if that commit fails.
        """
        try:
            if self._size >= self.segment_bytes:
                self._seal()
            locations = []
            offset = self._size
            for p in payloads:
                locations.append((self.active, offset, len(p), zlib.crc32(p)))
                offset += len(p)
            self._write_at(self._size, payloads, offset - self._size)
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                raise DiskFull(exc.errno, f"no space left for trajectory payloads in "
                               f"{self.directory}") from None
            raise
        self._size = offset
        self._dirty = True
        self.refs[self.active] += len(payloads)
        return locations

    def _write_at(self, start: int, payloads: list[bytes], total: int) -> None:
        """Write ``payloads`` at ``start`` of the active segment. Positioned writes: a
        write that failed part-way (a full disk) leaves its bytes past the segment's
        size, where the next append overwrites them, and they are given back."""
        try:
            # one writev spares a joined copy of the submission (~100 KB); past the
            # kernel's limit on buffers per call, or after a short write, the rest goes
            # joined
            written = os.pwritev(self._fd, payloads, start) if len(payloads) <= _IOV_MAX else 0
            if written < total:
                view = memoryview(b"".join(payloads))[written:]
                while view:
                    n = os.pwrite(self._fd, view, start + written)
                    written += n
                    view = view[n:]
        except OSError:
            os.ftruncate(self._fd, start)
            raise

    def sync(self) -> None:
        """Make every appended byte durable (before a ``synchronous=FULL`` commit)."""
        with self._lock:
            if self._dirty:
                os.fdatasync(self._fd)
                self._dirty = False

    def _seal(self) -> None:
        with self._lock:
            full = self.active
            fd = self._create(full + 1)  # first: if it fails, the active one goes on
            if self._dirty:
                self._unsynced.add(full)
            os.close(self._fd)
            os.rename(self._path(full, False), self._path(full, True))
            self.active += 1
            self._fd = fd
            self._size = 0
            self._dirty = False
        self._reclaim(full)

    # ---- reading and reclaiming ------------------------------------------------------

    def read(self, location: Location) -> bytes:
        segment, offset, length, crc = location
        data = os.pread(self._reader(segment), length, offset)
        if len(data) != length or zlib.crc32(data) != crc:
            raise PayloadCorrupt(
                f"payload at segment {segment} offset {offset} is truncated or corrupt"
            )
        return data

    def hold(self, locations: Iterable[Location]) -> None:
        """Count rows found in the ledger at start-up."""
        self.refs.update(loc[0] for loc in locations)

    def release(self, locations: Iterable[Location]) -> None:
        """The rows naming ``locations`` are gone (deleted and committed, or never were)."""
        touched = Counter(loc[0] for loc in locations)
        self.refs.subtract(touched)
        for segment in touched:
            self._reclaim(segment)

    def _reclaim(self, segment: int) -> None:
        if segment == self.active or self.refs[segment] > 0:
            return
        del self.refs[segment]
        self._unsynced.discard(segment)
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)
        for sealed in (True, False):
            self._path(segment, sealed).unlink(missing_ok=True)

    def reclaim_unreferenced(self) -> int:
        """Delete segments no row points into (after start-up); their number."""
        gone = 0
        for segment in self.segments_on_disk():
            if segment != self.active and self.refs[segment] <= 0:
                self._reclaim(segment)
                gone += 1
        return gone

    def stats(self) -> dict[str, int]:
        files = self.segments_on_disk()
        return {"segments": len(files),
                "bytes": sum(p.stat().st_size for p in files.values() if p.exists())}

    def close(self) -> None:
        """Make everything durable, seal the active segment (or drop it if empty), and
        close every file: the next start-up need not check anything."""
        for segment in self._unsynced:
            fd = os.open(self._path(segment, True), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._unsynced.clear()
        with self._lock:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        if self._size == 0:
            self._path(self.active, False).unlink(missing_ok=True)
        else:
            os.rename(self._path(self.active, False), self._path(self.active, True))
