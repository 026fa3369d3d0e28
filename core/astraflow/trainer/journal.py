"""The batches a trainer trained since its last checkpoint, in order.

A full checkpoint (model and optimiser moments) is costly: on the default job it took
14% of every step, and a 7B model's takes minutes. So a trainer checkpoints every
``checkpoint_interval`` seconds, and in between appends each batch it trained on to
this journal before acknowledging it. A restarted trainer loads its last checkpoint and
trains the journal's batches again, in order, which brings it back to the state it was
killed in: no acknowledged batch is lost, and none is trained twice.

Each record is a 4-byte little-endian length and a msgpack map (the step and the batch,
arrays as binary); a record cut short by a kill is ignored, as its batch was never
acknowledged and will be served again. Appends are flushed, not fsynced: a killed
process loses nothing the kernel holds, and a machine's power cut is not covered (as
with the data layer's payload segments).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgpack

from astraflow.dataflow.wire import batch_from_wire, batch_to_wire
from astraflow.types import Batch

_HEADER = struct.Struct("<I")


def _pack(step: int, version: int, batch: Batch) -> bytes:
    body: bytes = msgpack.packb({"step": step, "version": version,
                                 "batch": batch_to_wire(batch)})
    return _HEADER.pack(len(body)) + body


class BatchJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: Any = None

    def append(self, step: int, version: int, batch: Batch) -> None:
        """``batch`` trained at ``step``, which made ``version``."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("ab")
        self._fh.write(_pack(step, version, batch))
        self._fh.flush()

    def recover(self) -> list[tuple[int, int, Batch]]:
        """The whole records, oldest first; a torn last record is cut off, so what is
        appended next follows a whole one."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        out, pos = [], 0
        while pos + _HEADER.size <= len(data):
            (size,) = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + size
            if end > len(data):
                break  # the tail a kill cut short
            record = msgpack.unpackb(data[pos + _HEADER.size:end])
            out.append((int(record["step"]), int(record["version"]),
                        batch_from_wire(record["batch"])))
            pos = end
        if pos < len(data):
            with self.path.open("r+b") as fh:
                fh.truncate(pos)
        return out

    def clear(self) -> None:
        """After a checkpoint that holds every batch in the journal."""
        self.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
