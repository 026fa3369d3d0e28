"""Crash-safe file primitives: a reader sees either nothing or a complete file."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    """Persist a rename: without it a crash can forget that the new name exists."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Write to a temporary sibling, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def build_dir(out: Path, write: Callable[[Path], object], done: Callable[[Path], bool]) -> None:
    """``write`` a temporary sibling of ``out`` and rename it into place.

    Concurrent builders (pytest-xdist workers, several sessions sharing a cache) never
    see a half-written directory: the first to finish wins, and a later one whose
    ``done(out)`` already holds keeps the winner's files instead of replacing them.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        if not done(out):
            if out.exists():
                shutil.rmtree(out)  # stale: built from other arguments, or changed in place
            os.replace(tmp, out)
    except OSError:
        if not done(out):  # unless a concurrent builder won the race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
