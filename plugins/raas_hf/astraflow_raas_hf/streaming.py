"""Weights from a safetensors file into a model's tensors in place, a piece at a time.

``load_file`` then ``load_state_dict`` holds the whole file in memory next to the model
(and a second whole copy when the dtypes differ): a refresh of a 0.5B bfloat16 engine
took its process from 1 GB to 2.3 GB. Here the header is read first, every name and
shape checked against the model before anything is written, then each tensor is read
with plain file reads (not a memory map, whose pages would count against the process
once touched) through one buffer of at most :data:`CHUNK_BYTES` and copied, converted
to the dtype the model holds, straight into its parameter or buffer.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import prod
from typing import Any, BinaryIO

import torch

#: safetensors dtype -> torch dtype
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
#: the most read at once: the memory a refresh adds to the engine's, whatever the model
CHUNK_BYTES = 32 << 20
#: a corrupt header length must not allocate gigabytes
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class Entry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    nbytes: int


def read_header(f: BinaryIO, where: str) -> dict[str, Entry]:
    """The tensors of an open safetensors file, checked to lie within it."""
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError(f"weights at {where} are not a safetensors file")
    (n,) = struct.unpack("<Q", raw)
    size = os.fstat(f.fileno()).st_size
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise ValueError(f"weights at {where}: header length {n} does not fit the file")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"weights at {where}: the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ValueError(f"weights at {where}: the header is not a JSON object")
    header.pop("__metadata__", None)
    entries = {}
    for name, e in header.items():
        try:
            dtype, shape = e["dtype"], tuple(int(d) for d in e["shape"])
            start, end = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"weights at {where}: malformed entry {name!r}") from exc
        if dtype not in DTYPES:
            raise ValueError(f"weights at {where}: {name!r} has unsupported dtype {dtype}")
        nbytes = prod(shape) * DTYPES[dtype].itemsize
        if min(shape, default=0) < 0 or start < 0 or end - start != nbytes \
                or 8 + n + end > size:
            raise ValueError(f"weights at {where}: {name!r} ({dtype} {list(shape)}) does "
                             f"not fit its offsets {start}..{end} in a {size}-byte file")
        entries[name] = Entry(DTYPES[dtype], shape, 8 + n + start, nbytes)
    return entries


def check_fit(where: str, shapes: Mapping[str, tuple[int, ...]],
              targets: Mapping[str, torch.Tensor], tied: Iterable[str]) -> None:
    """Raise ValueError unless ``shapes`` (names to load) fit ``targets`` (the model's
    state) exactly; tied tensors may be absent (they are loaded with their twin)."""
    tied = set(tied)
    missing = [k for k in targets if k not in shapes and k not in tied]
    unexpected = [k for k in shapes if k not in targets]
    if unexpected or missing:
        raise ValueError(f"weights at {where} do not fit the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    wrong = [f"{k} {list(s)} for {list(targets[k].shape)}" for k, s in shapes.items()
             if tuple(targets[k].shape) != tuple(s)]
    if wrong:
        raise ValueError(f"weights at {where} do not fit the model: shapes {wrong[:5]}")


def load_into(model: Any, file: str, tied: Iterable[str], where: str) -> None:
    """Copy the tensors of safetensors ``file`` (under ``model``'s own names) into
    ``model``'s parameters and buffers, after checking that they fit it."""
    targets = model.state_dict()
    with open(file, "rb", buffering=0) as f:
        entries = read_header(f, where)
        check_fit(where, {k: e.shape for k, e in entries.items()}, targets, tied)
        largest = max((e.nbytes for e in entries.values()), default=0)
        buffer = torch.empty(min(largest, CHUNK_BYTES), dtype=torch.uint8)
        view = memoryview(buffer.numpy())
        # in file order: one sequential read of the file
        with torch.no_grad():
            for name, e in sorted(entries.items(), key=lambda kv: kv[1].start):
                try:
                    _copy(f, e, targets[name], buffer, view)
                except Exception as exc:
                    raise RuntimeError(f"weights at {where}: reading {name!r} failed after "
                                       "others were loaded; the engine's weights are now "
                                       "partly the new version's") from exc


def _copy(f: BinaryIO, e: Entry, target: torch.Tensor, buffer: torch.Tensor,
          view: memoryview) -> None:
    f.seek(e.start)
    if not target.is_contiguous():  # not seen in practice: the tensor whole
        data = torch.empty(e.nbytes, dtype=torch.uint8)
        _read(f, memoryview(data.numpy()))
        target.copy_(data.view(e.dtype).reshape(e.shape))
        return
    flat, itemsize = target.view(-1), e.dtype.itemsize
    step = buffer.numel() // itemsize * itemsize
    done = 0
    while done < e.nbytes:
        n = min(step, e.nbytes - done)
        _read(f, view[:n])
        flat[done // itemsize:(done + n) // itemsize].copy_(buffer[:n].view(e.dtype))
        done += n


def _read(f: BinaryIO, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = f.readinto(into[got:])  # type: ignore[attr-defined]
        if not n:
            raise ValueError("the file is cut short")
        got += n
