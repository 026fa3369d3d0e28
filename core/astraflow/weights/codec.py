"""Bit-exact sparse deltas between two versions of a tensor, and files of many of them.

Under bf16 most elements of an RL update do not change at all, and those that change
move by a few units in the last place. A delta therefore lists the 8-byte words of the
tensor's raw bytes that changed, and ``old ^ new`` for each of them:

* positions: gaps between changed word indices, split into byte planes, zstd (less than
  a byte per change at 1% density, against four for plain u32 element indices);
* values: the 64-bit XOR words, byte planes, zstd (mostly zero bytes: untouched lanes
  and unchanged high bits);
* a CRC32 over header and payload, so a flipped byte is refused, never applied.

Working on words, not elements, makes the format the same for BF16, F16 and F32, and
lets encoding run as a few numpy passes over cache-sized chunks: one streaming read of
both buffers, then work proportional to the number of changes.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from astraflow.weights import safetensors_io as st
from astraflow.weights.errors import CorruptError

MAGIC = b"AFWD"
FORMAT = 1
# magic, format, index width, reserved, n_bytes, n_words changed, index bytes, value bytes,
# crc32 of everything else
_HEADER = struct.Struct("<4sBBHQQQQI")
_CHUNK_WORDS = 1 << 15
_ZSTD_LEVEL = 1
DELTA_FORMAT = "astraflow-delta/1"
def _raw_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _words(raw: np.ndarray) -> np.ndarray:
    """The whole 8-byte words of a byte image (the tail, if any, is handled apart)."""
    return raw[: raw.size // 8 * 8].view(np.uint64)


def _tail_word(raw: np.ndarray) -> np.ndarray:
    """The trailing partial word, zero-padded to 8 bytes (empty if there is none)."""
    rest = raw.size % 8
    if not rest:
        return np.zeros(0, dtype=np.uint64)
    word = np.zeros(8, dtype=np.uint8)
    word[:rest] = raw[raw.size - rest :]
    return word.view(np.uint64)


def changes(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices (int64, sorted) of the 8-byte words whose bits differ, and old ^ new there.

    A trailing partial word counts as zero-padded.
    """
    if old.nbytes != new.nbytes:
        raise ValueError(f"cannot diff {old.nbytes} bytes against {new.nbytes} bytes")
    a, b = _raw_bytes(old), _raw_bytes(new)
    a64, b64 = _words(a), _words(b)
    xor = np.empty(min(_CHUNK_WORDS, a64.size), dtype=np.uint64)
    mask = np.empty(xor.size, dtype=bool)
    parts = []
    for start in range(0, a64.size, _CHUNK_WORDS):
        stop = min(start + _CHUNK_WORDS, a64.size)
        x, m = xor[: stop - start], mask[: stop - start]
        np.bitwise_xor(a64[start:stop], b64[start:stop], out=x)
        np.not_equal(x, 0, out=m)
        words = np.flatnonzero(m)
        if words.size:
            parts.append((words + start, x[words]))
    tail = _tail_word(a) ^ _tail_word(b)
    if tail.size and tail[0]:
        parts.append((np.array([a64.size], dtype=np.int64), tail))
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _planes(values: np.ndarray) -> bytes:
    """Byte planes (all low bytes, then the next...): zstd then sees long zero runs."""
    return np.ascontiguousarray(values.view(np.uint8).reshape(-1, values.itemsize).T).tobytes()


def _unplanes(data: bytes, dtype: np.dtype, count: int) -> np.ndarray:
    planes = np.frombuffer(data, dtype=np.uint8)
    if planes.size != count * dtype.itemsize:
        raise CorruptError(f"delta section holds {planes.size} bytes, expected "
                           f"{count * dtype.itemsize}")
    return np.ascontiguousarray(planes.reshape(dtype.itemsize, count).T).view(dtype).reshape(-1)


def encode_delta(old: np.ndarray, new: np.ndarray) -> bytes:
    """A self-checking delta that turns ``old``'s raw bits into ``new``'s, bit for bit."""
    words, xor = changes(old, new)
    width = 4 if old.nbytes <= 1 << 34 else 8
    if words.size:
        gaps = np.diff(words, prepend=-1) - 1
        index = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(
            _planes(gaps.astype(f"<u{width}")))
        values = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(_planes(xor))
    else:
        index = values = b""
    head = _HEADER.pack(MAGIC, FORMAT, width, 0, old.nbytes, words.size, len(index),
                        len(values), 0)[:-4]
    crc = zlib.crc32(values, zlib.crc32(index, zlib.crc32(head)))
    return head + struct.pack("<I", crc) + index + values


@dataclass(frozen=True)
class DecodedDelta:
    """Changed word indices and XOR words of one delta, checked against its CRC."""

    n_bytes: int
    words: np.ndarray
    xor: np.ndarray


def decode_delta(delta: bytes | memoryview | np.ndarray) -> DecodedDelta:
    blob = delta.data if isinstance(delta, np.ndarray) else memoryview(delta).cast("B")
    if len(blob) < _HEADER.size:
        raise CorruptError(f"delta is {len(blob)} bytes, shorter than its {_HEADER.size}-byte "
                           "header")
    magic, fmt, width, _, n_bytes, count, n_index, n_values, crc = _HEADER.unpack(
        blob[: _HEADER.size])
    if magic != MAGIC or fmt != FORMAT:
        raise CorruptError(f"not an AstraFlow delta (magic {bytes(magic)!r}, format {fmt})")
    if _HEADER.size + n_index + n_values != len(blob):
        raise CorruptError(f"delta is {len(blob)} bytes, its header announces "
                           f"{_HEADER.size + n_index + n_values}")
    index = blob[_HEADER.size : _HEADER.size + n_index]
    values = blob[_HEADER.size + n_index :]
    actual = zlib.crc32(values, zlib.crc32(index, zlib.crc32(blob[: _HEADER.size - 4])))
    if actual != crc:
        raise CorruptError(f"delta checksum mismatch (crc32 {actual:08x}, expected {crc:08x}): "
                           "the delta is corrupt; fetch it again or pull a full snapshot")
    n_words = -(-n_bytes // 8)
    if width not in (4, 8) or count > n_words:
        raise CorruptError(f"delta header is inconsistent (index width {width}, {count} changed "
                           f"words of {n_words})")
    if not count:
        return DecodedDelta(n_bytes, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64))
    try:
        dctx = zstandard.ZstdDecompressor()
        gap_bytes = dctx.decompress(index, max_output_size=count * width)
        xor_bytes = dctx.decompress(values, max_output_size=count * 8)
    except zstandard.ZstdError as exc:
        raise CorruptError(f"delta payload does not decompress: {exc}") from exc
    gaps = _unplanes(gap_bytes, np.dtype(f"<u{width}"), count).astype(np.int64)
    gaps += 1
    if gaps.min() < 1:
        raise CorruptError("delta word gaps overflow")
    words = np.cumsum(gaps)
    words -= 1
    if words[-1] >= n_words:
        raise CorruptError(f"delta words run past the tensor's {n_bytes} bytes")
    return DecodedDelta(n_bytes, words, _unplanes(xor_bytes, np.dtype("<u8"), count))


def _patch(dst: np.ndarray, words: np.ndarray, xor: np.ndarray) -> None:
    """XOR ``xor`` into the words of byte image ``dst``; the last word may be partial."""
    d64 = _words(dst)
    if words.size and words[-1] == d64.size:
        rest = dst.size - d64.size * 8
        dst[d64.size * 8 :] ^= xor[-1:].view(np.uint8)[:rest]
        words, xor = words[:-1], xor[:-1]
    d64[words] ^= xor


def apply_delta(old: np.ndarray, delta: bytes | memoryview | np.ndarray,
                out: np.ndarray | None = None) -> np.ndarray:
    """``new`` from ``old`` and ``encode_delta(old, new)``; ``out=old`` applies in place."""
    decoded = decode_delta(delta)
    if decoded.n_bytes != old.nbytes:
        raise ValueError(f"delta is for {decoded.n_bytes} bytes, tensor has {old.nbytes}")
    if out is None:
        out = np.array(old, order="C")
    elif out.shape != old.shape or out.dtype != old.dtype or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous array of the same shape and dtype as old")
    elif out is not old:
        np.copyto(out, old)
    _patch(out.reshape(-1).view(np.uint8), decoded.words, decoded.xor)
    return out


@dataclass(frozen=True)
class DeltaFile:
    """A version expressed as deltas against an earlier one; unchanged tensors are omitted."""

    base_version: int
    target_version: int
    layout: dict[str, tuple[str, tuple[int, ...]]]
    blobs: dict[str, np.ndarray]


def layout_of(tensors: Mapping[str, st.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}


def make_delta(base: Mapping[str, st.Tensor], target: Mapping[str, st.Tensor]) -> dict[str, bytes]:
    """Per-tensor deltas of the changed tensors; ValueError if names, dtypes or shapes differ."""
    if layout_of(base) != layout_of(target):
        raise ValueError("tensor names, dtypes or shapes changed; publish a full snapshot")
    blobs = {}
    for name, t in target.items():
        if changes(base[name].data, t.data)[0].size:
            blobs[name] = encode_delta(base[name].data, t.data)
    return blobs


def save_delta_file(path: Path | str, base_version: int, target_version: int,
                    target: Mapping[str, st.Tensor], blobs: Mapping[str, bytes]) -> st.FileInfo:
    """Store the blobs as U8 tensors of a safetensors file: a format every tool can open."""
    layout = {name: [dtype, list(shape)] for name, (dtype, shape) in layout_of(target).items()}
    metadata = {"format": DELTA_FORMAT, "base_version": str(base_version),
                "target_version": str(target_version), "layout": json.dumps(layout)}
    tensors = {name: st.Tensor("U8", (len(blob),), np.frombuffer(blob, dtype=np.uint8))
               for name, blob in blobs.items()}
    return st.save(path, tensors, metadata)


def load_delta_file(path: Path | str) -> DeltaFile:
    tensors, metadata = st.load(path)
    if metadata.get("format") != DELTA_FORMAT:
        raise CorruptError(f"{path} is not an AstraFlow delta file (format "
                           f"{metadata.get('format')!r})")
    try:
        layout = {name: (dtype, tuple(shape))
                  for name, (dtype, shape) in json.loads(metadata["layout"]).items()}
        base, target = int(metadata["base_version"]), int(metadata["target_version"])
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptError(f"{path}: malformed delta metadata: {exc}") from exc
    unknown = set(tensors) - set(layout)
    if unknown:
        raise CorruptError(f"{path}: deltas for tensors outside the layout: {sorted(unknown)}")
    return DeltaFile(base, target, layout, {name: t.data for name, t in tensors.items()})


def apply_delta_file(tensors: dict[str, st.Tensor], delta: DeltaFile) -> None:
    """Patch ``tensors`` (writable raw bits of version ``delta.base_version``) in place."""
    if layout_of(tensors) != delta.layout:
        raise ValueError(f"delta {delta.base_version}->{delta.target_version} expects another "
                         "tensor layout than the local copy")
    for name, blob in delta.blobs.items():
        data = tensors[name].data
        apply_delta(data, blob, out=data)
