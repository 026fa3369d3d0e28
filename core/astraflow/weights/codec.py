"""Bit-exact sparse deltas between two versions of a tensor, and files of many of them.

Under bf16 most elements of an RL update do not change at all, and those that change
move by a few units in the last place. A delta therefore lists the 16-bit lanes of the
tensor's raw bytes that changed, and ``old ^ new`` for each of them:

* positions: the gap to the previous changed lane in one byte, 255 escaping to a u32 in
  a side stream (about 1.3 bytes per change at 1% density, against four for plain u32
  element indices). Both go through zstd's fastest mode, which only collapses runs: the
  gaps of a sparse delta are close to uniform bytes (entropy coding would save 4% of them
  for a fifth of the encoding time), those of a dense one are runs of zeros;
* values: the XOR split into a low and a high byte plane, each zstd level 1 (the high
  plane is almost all zeros, the low one a handful of symbols);
* a CRC32 over header and payload, so a flipped byte is refused, never applied.

Lanes make one format for BF16, F16 and F32 (an F32 is two lanes) and for odd byte
counts (the last lane is zero-padded). Encoding is one compiled pass that reads both
buffers once (``_kernels.scan``); applying a delta writes only the changed lanes, after
every position has been checked, so a delta that does not fit is refused whole.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import zstandard

from astraflow.weights import safetensors_io as st
from astraflow.weights.errors import CorruptError

MAGIC = b"AFWD"
FORMAT = 2
# magic, format, 3 reserved, tensor bytes, changes, escapes, then the compressed size of
# each section in payload order: gap bytes (one per change), escapes (u32 each), low and
# high byte planes of the XORs; then a crc32 of the header and payload
_HEADER = struct.Struct("<4sB3xQQQQQQQ")
_CRC = struct.Struct("<I")
#: bytes per block of the scan (64 lanes), the unit in which tensors are split for it
_BLOCK_BYTES = 2 * 64
#: changes the encoder collects before handing them to zstd (7 bytes each): memory stays
#: bounded whatever the density, and the Python work per round does not show
_SCRATCH = 1 << 20
DELTA_FORMAT = "astraflow-delta/2"
# level 1 with short hash tables: the value planes hold a few symbols in short repeats,
# where deeper match search costs up to twice the time for no smaller output
_VALUES_ZSTD = zstandard.ZstdCompressionParameters.from_level(
    1, min_match=7, hash_log=8, chain_log=8, write_content_size=False)
_GAPS_ZSTD = zstandard.ZstdCompressionParameters.from_level(-1, write_content_size=False)


def _kernels() -> ModuleType:
    """The compiled loops, imported on first use: numba is slow to import."""
    from astraflow.weights import _kernels

    return _kernels


def _raw_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _lanes(raw: np.ndarray) -> np.ndarray:
    """The whole 16-bit lanes of a byte image (an odd last byte is handled apart)."""
    return raw[: raw.size // 2 * 2].view(np.uint16)


def _blocks(raw: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """(u16 lanes in whole scan blocks, first lane): the whole blocks in place, then the
    rest zero-padded to one block (zeros on both sides never count as changes)."""
    full = raw.size // _BLOCK_BYTES * _BLOCK_BYTES
    rest = np.zeros(_BLOCK_BYTES if full < raw.size else 0, dtype=np.uint8)
    rest[: raw.size - full] = raw[full:]
    return [(raw[:full].view(np.uint16), 0), (rest.view(np.uint16), full // 2)]


def _encode(old: np.ndarray, new: np.ndarray) -> tuple[int, bytes]:
    """(changed lanes, delta): the count tells callers whether anything changed at all.

    The kernel fills fixed scratch streams that zstd takes round by round, so no
    tensor-sized index or value array is built even when every lane changed.
    """
    if old.nbytes != new.nbytes:
        raise ValueError(f"cannot diff {old.nbytes} bytes against {new.nbytes} bytes")
    kernels = _kernels()
    spare = kernels.reserve(-(-old.nbytes // 2))
    # gap bytes, escapes, low and high bytes of the XORs: the sections, in payload order
    scratch = [np.empty(_SCRATCH + spare, dtype=dtype)
               for dtype in (np.uint8, np.uint32, np.uint8, np.uint8)]
    # one compressor each: a compressor serves one stream at a time
    streams = [zstandard.ZstdCompressor(compression_params=params).compressobj()
               for params in (_GAPS_ZSTD, _GAPS_ZSTD, _VALUES_ZSTD, _VALUES_ZSTD)]
    chunks: list[list[bytes]] = [[], [], [], []]
    count = n_escapes = 0
    last = -1
    for (a, lane_base), (b, _) in zip(_blocks(_raw_bytes(old)), _blocks(_raw_bytes(new)),
                                      strict=True):
        block, n_blocks = 0, a.size // kernels.BLOCK_LANES
        while block < n_blocks:
            block, k, e, last = kernels.scan(a, b, block, lane_base, last, spare, *scratch)
            for chunk, stream, data, size in zip(chunks, streams, scratch, (k, e, k, k),
                                                 strict=True):
                if size:
                    chunk.append(stream.compress(data[:size]))
            count, n_escapes = count + k, n_escapes + e
    payload = [b"".join([*chunk, stream.flush()]) if chunk else b""
               for chunk, stream in zip(chunks, streams, strict=True)]
    head = _HEADER.pack(MAGIC, FORMAT, old.nbytes, count, n_escapes,
                        *(len(section) for section in payload))
    crc = zlib.crc32(head)
    for section in payload:
        crc = zlib.crc32(section, crc)
    return count, b"".join([head, _CRC.pack(crc), *payload])


def encode_delta(old: np.ndarray, new: np.ndarray) -> bytes:
    """A self-checking delta that turns ``old``'s raw bits into ``new``'s, bit for bit."""
    return _encode(old, new)[1]


@dataclass(frozen=True)
class _Decoded:
    """One delta, checked: ``lanes`` (ascending) all lie inside the tensor."""

    lanes: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _decode(delta: bytes | memoryview | np.ndarray, n_bytes: int) -> _Decoded:
    """The checked changes of ``delta``, which must be for a tensor of ``n_bytes``."""
    blob = delta.data if isinstance(delta, np.ndarray) else memoryview(delta).cast("B")
    start = _HEADER.size + _CRC.size
    if len(blob) < start:
        raise CorruptError(f"delta is {len(blob)} bytes, shorter than its {start}-byte header")
    magic, fmt, delta_bytes, count, n_escapes, *sizes = _HEADER.unpack(blob[: _HEADER.size])
    if magic != MAGIC or fmt != FORMAT:
        raise CorruptError(f"not an AstraFlow delta (magic {bytes(magic)!r}, format {fmt})")
    if start + sum(sizes) != len(blob):
        raise CorruptError(f"delta is {len(blob)} bytes, its header announces "
                           f"{start + sum(sizes)}")
    (crc,) = _CRC.unpack(blob[_HEADER.size : start])
    actual = zlib.crc32(blob[start:], zlib.crc32(blob[: _HEADER.size]))
    if actual != crc:
        raise CorruptError(f"delta checksum mismatch (crc32 {actual:08x}, expected {crc:08x}): "
                           "the delta is corrupt; fetch it again or pull a full snapshot")
    if delta_bytes != n_bytes:
        raise ValueError(f"delta is for {delta_bytes} bytes, tensor has {n_bytes}")
    n_lanes = -(-n_bytes // 2)
    if count > n_lanes or n_escapes > count:
        raise CorruptError(f"delta header is inconsistent ({count} changed lanes of {n_lanes}, "
                           f"{n_escapes} escapes)")
    dctx = zstandard.ZstdDecompressor()
    streams, offset = [], start
    for size, expected in zip(sizes, (count, 4 * n_escapes, count, count), strict=True):
        try:
            stream = dctx.decompress(blob[offset : offset + size],
                                     max_output_size=expected) if size else b""
        except zstandard.ZstdError as exc:
            raise CorruptError(f"delta payload does not decompress: {exc}") from exc
        if len(stream) != expected:
            raise CorruptError(f"delta section holds {len(stream)} bytes, expected {expected}")
        streams.append(stream)
        offset += size
    gaps, low, high = (np.frombuffer(streams[i], dtype=np.uint8) for i in (0, 2, 3))
    escapes = np.frombuffer(streams[1], dtype="<u4")
    lanes = np.empty(count, dtype=np.uint64)
    if not _kernels().positions(gaps, escapes, n_lanes, lanes):
        raise CorruptError(f"delta positions do not fit the tensor's {n_bytes} bytes")
    if n_bytes % 2 and count and lanes[-1] == n_lanes - 1 and high[-1]:
        raise CorruptError("delta changes a byte past the tensor's odd last byte")
    return _Decoded(lanes, low, high)


def apply_delta(old: np.ndarray, delta: bytes | memoryview | np.ndarray,
                out: np.ndarray | None = None) -> np.ndarray:
    """``new`` from ``old`` and ``encode_delta(old, new)``; ``out=old`` applies in place.

    Into another buffer, the copy is one ``np.copyto``: a large copy streams past the
    cache, which block-wise copy-and-patch loops cannot, and patching afterwards touches
    only the changed lines.
    """
    decoded = _decode(delta, old.nbytes)
    if out is None:
        out = np.empty(old.shape, dtype=old.dtype)
    elif out.shape != old.shape or out.dtype != old.dtype or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous array of the same shape and dtype as old")
    if out is not old:
        np.copyto(out, old)
    dst = out.reshape(-1).view(np.uint8)
    lanes, low, high = decoded.lanes, decoded.low, decoded.high
    if dst.size % 2 and lanes.size and lanes[-1] == dst.size // 2:
        # the half lane of an odd last byte is patched here, not by the lane kernel
        dst[-1] ^= low[-1]
        lanes, low, high = lanes[:-1], low[:-1], high[:-1]
    _kernels().patch(_lanes(dst), lanes, low, high)
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
        count, blob = _encode(base[name].data, t.data)
        if count:
            blobs[name] = blob
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
