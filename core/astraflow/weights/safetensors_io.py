"""Torch-free safetensors for BF16/F16/F32 weights.

numpy has no bfloat16, so every tensor travels as its raw bits (uint16 for BF16 and
F16, uint32 for F32) next to the safetensors dtype string. The files written here are
standard safetensors (``safetensors.torch.load_file`` returns torch.bfloat16) and
canonical: the same tensors always give the same bytes, so a node that rebuilds a
version from deltas can check its result against the sha256 of the full snapshot.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from astraflow.weights._fs import atomic_file
from astraflow.weights.errors import CorruptError

#: safetensors dtype -> numpy dtype of its raw bits
RAW_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<u2"),
    "F32": np.dtype("<u4"),
    "U8": np.dtype("u1"),
}
#: refuse headers larger than this: a corrupt length must not allocate gigabytes
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class Tensor:
    """One tensor as raw bits: ``data`` has the raw numpy dtype of ``dtype``."""

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        if self.dtype not in RAW_DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; supported: {sorted(RAW_DTYPES)}")
        raw = RAW_DTYPES[self.dtype]
        if self.data.dtype != raw:
            raise ValueError(f"{self.dtype} tensors carry raw bits as {raw}, got {self.data.dtype}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.data.size != prod(self.shape):
            raise ValueError(f"data has {self.data.size} elements, shape {self.shape} needs "
                             f"{prod(self.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.size * self.data.itemsize

    @property
    def flat(self) -> np.ndarray:
        """The raw bits as a 1-D C-contiguous array (a view when possible)."""
        return np.ascontiguousarray(self.data).reshape(-1)

    @classmethod
    def from_array(cls, array: np.ndarray, dtype: str | None = None) -> Tensor:
        """Wrap float16/float32 values, or raw bits when ``dtype`` names their format."""
        array = np.asarray(array)
        if dtype is None:
            dtype = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}.get(array.dtype)
            if dtype is None:
                raise ValueError(f"cannot infer the dtype of {array.dtype} values; pass dtype=")
        raw = RAW_DTYPES[dtype]
        if array.dtype.kind == "f":
            if array.dtype.itemsize != raw.itemsize:
                raise ValueError(f"{array.dtype} values do not fit {dtype}")
            array = array.view(raw)
        return cls(dtype, array.shape, np.ascontiguousarray(array, dtype=raw))

    def to_float32(self) -> np.ndarray:
        """Values as float32 (exact for all three float formats)."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        if self.dtype == "F16":
            return self.data.view(np.float16).astype(np.float32)
        if self.dtype == "F32":
            return self.data.view(np.float32).copy()
        raise ValueError(f"{self.dtype} is not a float format")


def bf16_from_float32(values: np.ndarray) -> Tensor:
    """Round float32 to bfloat16 (nearest, ties to even), as torch's ``.to(bfloat16)``."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return Tensor("BF16", np.shape(values), out)


def from_torch(tensor: Any, copy: bool = True) -> Tensor:
    """Raw bits of a torch tensor (imports torch only when a trainer calls this).

    ``copy=False`` shares the tensor's memory: for a snapshot nothing writes to again
    (``export_weights``'s copies), so a 0.5B model's publish holds 1 GB less."""
    import torch

    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
    if tensor.dtype not in names:
        raise ValueError(f"unsupported torch dtype {tensor.dtype}; cast to bfloat16 first")
    dtype = names[tensor.dtype]
    view_as = torch.int32 if dtype == "F32" else torch.int16
    raw = tensor.detach().to("cpu").contiguous().view(view_as).numpy().view(RAW_DTYPES[dtype])
    return Tensor(dtype, tuple(tensor.shape), raw.copy() if copy else raw)


@dataclass(frozen=True)
class FileInfo:
    sha256: str
    bytes: int


def _header(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None) -> bytes:
    entries: dict[str, Any] = {}
    if metadata:
        entries["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    offset = 0
    # a lazy mapping (OnDisk, a patched version) says its layout without reading a tensor
    layout = getattr(tensors, "layout", None)
    for name in sorted(tensors):
        if layout is not None:
            dtype, shape = layout[name]
            nbytes = prod(shape) * RAW_DTYPES[dtype].itemsize
        else:
            t = tensors[name]
            dtype, shape, nbytes = t.dtype, t.shape, t.nbytes
        entries[name] = {"dtype": dtype, "shape": list(shape),
                         "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _chunks(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None) -> Iterator:
    yield _header(tensors, metadata)
    for name in sorted(tensors):
        # numpy's stubs declare an array's buffer protocol for Python >= 3.12 only
        yield memoryview(tensors[name].flat).cast("B")  # type: ignore[arg-type]


def save(path: Path | str, tensors: Mapping[str, Tensor],
         metadata: Mapping[str, str] | None = None) -> FileInfo:
    """Write atomically; returns the sha256 and size of the bytes written."""
    h, size = hashlib.sha256(), 0
    with atomic_file(Path(path)) as f:
        for chunk in _chunks(tensors, metadata):
            h.update(chunk)
            f.write(chunk)
            size += len(chunk)
    return FileInfo(h.hexdigest(), size)


def digest(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None) -> FileInfo:
    """What ``save`` would return, without writing anything."""
    h, size = hashlib.sha256(), 0
    for chunk in _chunks(tensors, metadata):
        h.update(chunk)
        size += len(chunk)
    return FileInfo(h.hexdigest(), size)


def parse(buffer: np.ndarray) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors (views into ``buffer``, a uint8 array) and metadata of a safetensors image.

    Every offset is checked so that a truncated or tampered file raises CorruptError
    instead of yielding garbage tensors.
    """
    if buffer.size < 8:
        raise CorruptError(f"not a safetensors file: {buffer.size} bytes, need at least 8")
    (n,) = struct.unpack("<Q", buffer[:8].tobytes())
    if n > MAX_HEADER_BYTES or 8 + n > buffer.size:
        raise CorruptError(f"safetensors header length {n} does not fit a {buffer.size}-byte file")
    try:
        header = json.loads(buffer[8 : 8 + n].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptError(f"safetensors header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CorruptError("safetensors header must be a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data = buffer[8 + n :]
    tensors: dict[str, Tensor] = {}
    spans = []
    for name, entry in header.items():
        try:
            dtype, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
            start, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptError(f"tensor {name!r}: malformed header entry {entry!r}") from exc
        if dtype not in RAW_DTYPES:
            raise CorruptError(f"tensor {name!r}: unsupported dtype {dtype!r}; "
                               f"supported: {sorted(RAW_DTYPES)}")
        raw = RAW_DTYPES[dtype]
        if min(shape, default=0) < 0 or not 0 <= start <= end <= data.size:
            raise CorruptError(f"tensor {name!r}: offsets {start}..{end} outside the "
                               f"{data.size}-byte data section")
        if end - start != prod(shape) * raw.itemsize:
            raise CorruptError(f"tensor {name!r}: {end - start} bytes for shape {shape} {dtype}")
        spans.append((start, end))
        tensors[name] = Tensor(dtype, shape, data[start:end].view(raw).reshape(shape))
    spans.sort()
    position = 0
    for start, end in spans:
        if start != position:
            raise CorruptError("safetensors data section has gaps or overlapping tensors")
        position = end
    if position != data.size:
        raise CorruptError(f"safetensors data section has {data.size - position} trailing bytes")
    return tensors, dict(metadata)


def load(path: Path | str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read a whole file into memory; the tensors are writable views of one buffer."""
    return parse(np.fromfile(path, dtype=np.uint8))


class OnDisk(Mapping[str, Tensor]):
    """A safetensors file's tensors, each read from disk when asked for and not kept:
    a whole model's worth of bits held by the file, not by this process (reads, not a
    memory map, whose pages would count against the process once touched)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        with self.path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                raise CorruptError(f"{self.path}: safetensors header length {n}")
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        self._start = 8 + n
        self._entries = {name: (e["dtype"], tuple(int(d) for d in e["shape"]),
                                int(e["data_offsets"][0]), int(e["data_offsets"][1]))
                         for name, e in header.items()}
        #: each tensor's dtype and shape, known without reading it
        self.layout = {name: (dtype, shape) for name, (dtype, shape, _, _)
                       in self._entries.items()}

    def __getitem__(self, name: str) -> Tensor:
        dtype, shape, start, end = self._entries[name]
        data = np.empty(end - start, dtype=np.uint8)
        with self.path.open("rb") as f:
            f.seek(self._start + start)
            if f.readinto(memoryview(data)) != data.size:  # type: ignore[arg-type]
                raise CorruptError(f"{self.path}: tensor {name!r} is cut short")
        return Tensor(dtype, shape, data.view(RAW_DTYPES[dtype]).reshape(shape))

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
