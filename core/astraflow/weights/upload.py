"""The data layer's side of chunked, resumable weight uploads.

A version's file is sent in chunks that each fit the data layer's request size limit
(a 1 GB ``model.safetensors`` does not fit one request, and the limit stays). Each chunk
carries its byte offset and its own sha256 and is checked before a byte of it is
written; the bytes held so far live in ``<store>/<policy>/.upload-v<version>/<name>``,
next to a small ``.<name>.sha256`` naming the whole file they are the start of. The
partial file is always a prefix of checked chunks (a chunk is checked whole before it
is written), so after the data layer was killed its size is what it holds, and a
publisher -- the same one, or a trainer restarted on the same version -- asks for that
size and sends only the rest. Bytes held for another file (a different whole-file
sha256) count as none and are replaced by the next chunk at offset 0.

The whole file's sha256 is computed as its chunks arrive, while they arrive in order
from offset 0 in this process; such a digest is kept only in memory, and tied to the
file's inode, size and modification time after the last write. Anything else -- a
restart, a chunk sent again from an earlier offset, a file changed behind our back --
drops it, and the commit hashes the file from disk as before: the digest is a shortcut,
never a second source of truth.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.weights._fs import atomic_file
from astraflow.weights.store import check_policy

#: the largest chunk a publisher sends; the data layer states a smaller one when its
#: request size limit (``dataflow.max_body_bytes``) is smaller
CHUNK_BYTES = 16 << 20


class OffsetError(ValueError):
    """A chunk starts past the bytes held: the sender must resume at ``held``."""

    def __init__(self, name: str, offset: int, held: int) -> None:
        super().__init__(f"{name}: a chunk at offset {offset} is past the {held} bytes held "
                         f"of this file; resume at offset {held}")
        self.held = held


class ChunkTooLargeError(ValueError):
    """Held bytes plus a chunk would exceed the per-file limit."""


def sidecar(path: Path) -> Path:
    """Where the whole-file sha256 of the bytes held in ``path`` is written."""
    return path.with_name(f".{path.name}.sha256")


@dataclass
class _Running:
    """sha256 of ``size`` bytes written to one file, and that file's identity after."""

    digest: Any  # hashlib's sha256 object
    size: int
    stat: tuple[int, int, int]


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


class Uploads:
    """Partial upload files of one weight store; thread-safe. Chunks and a commit of the
    same version are serialised by a lock per upload directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._guard = threading.Lock()
        self._locks: dict[Path, threading.Lock] = {}
        self._running: dict[Path, _Running] = {}

    def directory(self, policy: str, version: int) -> Path:
        return self.root / check_policy(policy) / f".upload-v{int(version)}"

    @contextlib.contextmanager
    def locked(self, directory: Path) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(directory, threading.Lock())
        with lock:
            yield

    def held(self, path: Path, sha256: str) -> int:
        """How many bytes of the file whose sha256 is ``sha256`` ``path`` holds."""
        try:
            if sidecar(path).read_text().strip() != sha256.lower():
                return 0
            return path.stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return 0

    def write(self, directory: Path, name: str, sha256: str, offset: int,
              data: bytes | bytearray, max_bytes: int) -> int:
        """Put a checked chunk at ``offset`` (at most the bytes held; below it, what
        follows is written again); returns the bytes held after it."""
        path = directory / name
        sha256 = sha256.lower()
        with self.locked(directory):
            held = self.held(path, sha256)
            if offset > held:
                raise OffsetError(name, offset, held)
            if offset + len(data) > max_bytes:
                raise ChunkTooLargeError(f"{name}: {offset + len(data)} bytes exceed the "
                                         f"{max_bytes}-byte limit of a weight file")
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            with open(fd, "r+b") as f:
                before = _identity(os.fstat(f.fileno()))
                # cut first, then name the file: a kill in between leaves an empty file
                # under either name, never another file's bytes under this one's
                f.truncate(offset)
                if held == 0 and offset == 0:
                    with atomic_file(sidecar(path)) as s:
                        s.write(sha256.encode())
                f.seek(offset)
                f.write(data)
                f.flush()
                after = _identity(os.fstat(f.fileno()))
            self._advance(path, offset, data, before, after)
            return offset + len(data)

    def _advance(self, path: Path, offset: int, data: bytes | bytearray,
                 before: tuple[int, int, int], after: tuple[int, int, int]) -> None:
        with self._guard:
            running = self._running.pop(path, None)
            if offset == 0:
                running = _Running(hashlib.sha256(), 0, before)
            if running is None or running.size != offset or running.stat != before:
                return  # not in order from 0 in this process: the commit hashes the file
            running.digest.update(data)
            running.size, running.stat = offset + len(data), after
            self._running[path] = running

    def put_whole(self, directory: Path, name: str, sha256: str, tmp: Path) -> None:
        """Move a whole file, received and checked in one request, into place."""
        path = directory / name
        with self.locked(directory):
            os.replace(tmp, path)
            with atomic_file(sidecar(path)) as s:
                s.write(sha256.lower().encode())
            with self._guard:
                self._running.pop(path, None)

    def digest(self, path: Path) -> str | None:
        """The sha256 computed as ``path``'s chunks arrived, if the file is exactly what
        was written then; None when the file must be hashed from disk."""
        with self._guard:
            running = self._running.get(path)
        try:
            now = _identity(path.stat())
        except FileNotFoundError:
            return None
        if running is None or running.stat != now:
            return None
        digest: str = running.digest.hexdigest()
        return digest

    def discard(self, path: Path) -> None:
        """Drop the bytes held in ``path`` (they failed the whole file's check)."""
        path.unlink(missing_ok=True)
        sidecar(path).unlink(missing_ok=True)
        with self._guard:
            self._running.pop(path, None)

    def forget(self, directory: Path) -> None:
        """Drop what is remembered of an upload directory (committed or removed)."""
        with self._guard:
            for path in [p for p in self._running if p.parent == directory]:
                del self._running[path]
            self._locks.pop(directory, None)
