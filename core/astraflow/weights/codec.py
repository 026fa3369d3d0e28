"""Bit-exact sparse deltas between two versions of a tensor, and files of many of them.

Under bf16 most elements of an RL update do not change at all, and those that change
move by a unit or two in the last place. A delta therefore lists the 16-bit lanes of the
tensor's raw bytes that changed, and how each lane's integer moved:

* positions: the gap to the previous changed lane in one byte, 255 escaping to a u32 in
  a side stream (about 1.3 bytes per change at 1% density, against four for plain u32
  element indices). The gap bytes go through zstd's fastest mode, which only collapses
  runs (those of a dense delta are runs of zeros), and are kept raw when that saves
  nothing (those of a sparse one are close to uniform bytes);
* moves: the 16-bit difference ``new - old``, zigzag coded, in two bits per change for a
  move of -1, +1 or -2 ulp (a bf16 or f16 step of one ulp is +-1 on its bit pattern), any
  other move escaping to a u16 in a side stream. Two bits per change is smaller than
  zstd made of XOR byte planes, and costs nothing to encode or decode (zstd on the
  values was an eighth of the encoding time);
* a CRC-32C (the Castagnoli polynomial, which CPUs compute in hardware) over header and
  payload, so a flipped byte is refused, never applied.

Lanes make one format for BF16, F16 and F32 (an F32 is two lanes) and for odd byte
counts (the last lane is zero-padded). Encoding is one compiled pass that reads both
buffers once (``_kernels.scan``); applying a delta writes only the changed lanes, after
the whole delta has been checked, so a delta that does not fit is refused whole.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import crc32c
import numpy as np
import zstandard

from astraflow.weights import safetensors_io as st
from astraflow.weights.errors import CorruptError

MAGIC = b"AFWD"
FORMAT = 3
# magic, format, flags (1: gap bytes raw, not zstd), 2 reserved, tensor bytes, changes,
# gap escapes, value escapes, stored size of the gap bytes; then a CRC-32C of the header
# and payload. The payload: the gap bytes, zeros up to a multiple of 8 bytes from the
# delta's start, then raw little-endian arrays: 2-bit move codes (32 per u64), gap
# escapes (u32), escaped moves (u16, zigzag)
_HEADER = struct.Struct("<4sBB2xQQQQQ")
_RAW_GAPS = 1
_CRC = struct.Struct("<I")
#: lanes per block of the scan, the unit in which tensors are split for it
_BLOCK_BYTES = 2 * 64
#: changes the encoder collects before handing their gap bytes to zstd: memory stays
#: bounded whatever the density, and the Python work per round does not show
_SCRATCH = 1 << 20
DELTA_FORMAT = "astraflow-delta/3"
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

    The kernel fills fixed scratch streams that are flushed round by round, so no
    tensor-sized index or value array is built even when every lane changed.
    """
    if old.nbytes != new.nbytes:
        raise ValueError(f"cannot diff {old.nbytes} bytes against {new.nbytes} bytes")
    kernels = _kernels()
    n_lanes = -(-old.nbytes // 2)
    spare = kernels.reserve(n_lanes)
    gaps, escapes, values = (np.empty(_SCRATCH + spare, dtype=dtype)
                             for dtype in (np.uint8, np.uint32, np.uint16))
    # 32 codes a word; a round's last word, if part full, starts the next round's codes
    codes = np.zeros((_SCRATCH + spare) // 32 + 2, dtype=np.uint64)
    code_chunks: list[bytes] = []
    phase = 0
    compressor = zstandard.ZstdCompressor(compression_params=_GAPS_ZSTD)
    # the first round's gap bytes decide: zstd if it shrinks them (runs of zeros, a
    # dense delta), else raw (a sparse delta's gaps are close to uniform bytes)
    gap_stream: zstandard.ZstdCompressionObj | None = None
    gap_chunks: list[bytes] = []
    raw_gaps: list[bytes] | None = None
    escape_chunks: list[bytes] = []
    value_chunks: list[bytes] = []
    count, last = 0, -1
    for (a, lane_base), (b, _) in zip(_blocks(_raw_bytes(old)), _blocks(_raw_bytes(new)),
                                      strict=True):
        block, n_blocks = 0, a.size // kernels.BLOCK_LANES
        while block < n_blocks:
            block, k, e, v, last = kernels.scan(a, b, block, lane_base, last, spare, gaps,
                                                escapes, values, codes, phase)
            full, phase = divmod(phase + k, 32)
            if full:
                code_chunks.append(codes[:full].astype("<u8", copy=False).tobytes())
                codes[0] = codes[full] if phase else 0
                codes[1 : full + 1] = 0
            if k and gap_stream is None and raw_gaps is None:
                # numpy's stubs declare an array's buffer protocol for Python >= 3.12 only
                if len(compressor.compress(gaps[:k])) < 0.9 * k:  # type: ignore[arg-type]
                    gap_stream = compressor.compressobj()
                else:
                    raw_gaps = []
            if k and gap_stream is not None:
                gap_chunks.append(gap_stream.compress(gaps[:k]))  # type: ignore[arg-type]
            elif k:
                assert raw_gaps is not None  # chosen above at the first gaps
                raw_gaps.append(gaps[:k].tobytes())
            if e:
                escape_chunks.append(escapes[:e].astype("<u4", copy=False).tobytes())
            if v:
                value_chunks.append(values[:v].astype("<u2", copy=False).tobytes())
            count += k
    if gap_stream is not None:
        gap_bytes, flags = b"".join([*gap_chunks, gap_stream.flush()]), 0
    else:  # raw gap bytes are read in place, not decompressed
        gap_bytes, flags = b"".join(raw_gaps or []), _RAW_GAPS
    n_escapes = sum(len(c) for c in escape_chunks) // 4
    n_values = sum(len(c) for c in value_chunks) // 2
    head = _HEADER.pack(MAGIC, FORMAT, flags, old.nbytes, count, n_escapes, n_values,
                        len(gap_bytes))
    if phase:
        code_chunks.append(codes[:1].astype("<u8", copy=False).tobytes())
    payload = [gap_bytes, bytes(-(_HEADER.size + _CRC.size + len(gap_bytes)) % 8),
               *code_chunks, *escape_chunks, *value_chunks]
    crc = crc32c.crc32c(head)
    for section in payload:
        crc = crc32c.crc32c(section, crc)
    return count, b"".join([head, _CRC.pack(crc), *payload])


def encode_delta(old: np.ndarray, new: np.ndarray) -> bytes:
    """A self-checking delta that turns ``old``'s raw bits into ``new``'s, bit for bit."""
    return _encode(old, new)[1]


@dataclass(frozen=True)
class _Decoded:
    """One delta, checked: its changes ascend and ``last`` (-1: none) lies inside the
    tensor; the side streams match the gaps and codes."""

    gaps: np.ndarray
    escapes: np.ndarray
    codes: np.ndarray
    values: np.ndarray
    last: int


def _decode(delta: bytes | memoryview | np.ndarray, n_bytes: int) -> _Decoded:
    """The checked changes of ``delta``, which must be for a tensor of ``n_bytes``."""
    blob = delta.data if isinstance(delta, np.ndarray) else memoryview(delta).cast("B")
    start = _HEADER.size + _CRC.size
    if len(blob) < start:
        raise CorruptError(f"delta is {len(blob)} bytes, shorter than its {start}-byte header")
    magic, fmt, flags, delta_bytes, count, n_escapes, n_values, gap_size = _HEADER.unpack(
        blob[: _HEADER.size])
    if magic != MAGIC or fmt != FORMAT or flags & ~_RAW_GAPS:
        raise CorruptError(f"not an AstraFlow delta of format {FORMAT} (magic "
                           f"{bytes(magic)!r}, format {fmt}, flags {flags})")
    n_lanes = -(-n_bytes // 2)
    if count > n_lanes + (n_lanes >> 32) or n_escapes > count or n_values > count:
        raise CorruptError(f"delta header is inconsistent ({count} changed lanes of {n_lanes}, "
                           f"{n_escapes} gap escapes, {n_values} escaped moves)")
    n_words = -(-count // 32)
    sizes = (gap_size, -(start + gap_size) % 8, 8 * n_words, 4 * n_escapes, 2 * n_values)
    if start + sum(sizes) != len(blob):
        raise CorruptError(f"delta is {len(blob)} bytes, its header announces "
                           f"{start + sum(sizes)}")
    (crc,) = _CRC.unpack(blob[_HEADER.size : start])
    actual = crc32c.crc32c(blob[start:], crc32c.crc32c(blob[: _HEADER.size]))
    if actual != crc:
        raise CorruptError(f"delta checksum mismatch (crc32c {actual:08x}, expected {crc:08x}): "
                           "the delta is corrupt; fetch it again or pull a full snapshot")
    if delta_bytes != n_bytes:
        raise ValueError(f"delta is for {delta_bytes} bytes, tensor has {n_bytes}")
    raw = np.frombuffer(blob, dtype=np.uint8)
    if flags & _RAW_GAPS:
        gaps = raw[start : start + gap_size]
    else:
        try:
            gaps = np.frombuffer(zstandard.ZstdDecompressor().decompress(
                blob[start : start + gap_size], max_output_size=count) if gap_size else b"",
                dtype=np.uint8)
        except zstandard.ZstdError as exc:
            raise CorruptError(f"delta payload does not decompress: {exc}") from exc
    if gaps.size != count:
        raise CorruptError(f"delta holds {gaps.size} gap bytes, expected {count}")
    offset = start + gap_size + sizes[1]
    arrays = []
    for size, dtype in zip(sizes[2:], ("<u8", "<u4", "<u2"), strict=True):
        arrays.append(raw[offset : offset + size].view(dtype))
        offset += size
    codes, escapes, values = arrays
    last = _kernels().check(gaps, escapes, codes, values, n_lanes)
    if last < -1:
        raise CorruptError(f"delta positions or moves do not fit the tensor's {n_bytes} bytes")
    return _Decoded(gaps, escapes, codes, values, last)


def _last_move(d: _Decoded) -> int:
    """The 16-bit difference ``new - old`` of the last change (whose escaped move, if it
    escaped, is the last of ``values``)."""
    k = d.gaps.size - 1
    zz = int(d.codes[k >> 5] >> np.uint64(2 * (k & 31))) & 3 or int(d.values[-1])
    return ((zz >> 1) ^ -(zz & 1)) & 0xFFFF


def warm() -> None:
    """Compile the codec's kernels into numba's cache beside them (``make test`` does,
    as it writes the bytecode), so the first delta a trainer, a node or a test encodes
    or applies does not pay a few seconds of compilation. Every variant is compiled:
    numba compiles a kernel apart for read-only and writable buffers."""
    rng = np.random.default_rng(0)
    cases = []
    for dtype, n, hits in ((np.uint16, 1 << 14, (np.arange(0, 1 << 14, 3),  # gaps compress
                                                 rng.choice(1 << 14, 3000, replace=False),
                                                 np.arange(0, 1 << 14, 700),  # escaped gaps
                                                 np.arange(0))),  # no change
                           (np.uint8, 1001, (np.arange(0, 1001, 5), np.array([1000]))),
                           (np.uint16, 1 << 18, (np.arange(0, 1 << 18, 2),))):  # threads
        old = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
        for hit in hits:
            new = old.copy()
            new[np.sort(hit)] ^= np.array([1, 0xFF, 0x34], dtype)[np.arange(hit.size) % 3]
            cases.append((old, new))
    for old, new in cases:
        delta = encode_delta(old, new)
        for blob in (delta, np.frombuffer(bytearray(delta), dtype=np.uint8)):
            apply_delta(old, blob, threads=1)
            apply_delta(old, blob, out=old.copy(), threads=2)
            inplace = old.copy()
            apply_delta(inplace, blob, out=inplace, threads=2)


def apply_delta(old: np.ndarray, delta: bytes | memoryview | np.ndarray,
                out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """``new`` from ``old`` and ``encode_delta(old, new)``; ``out=old`` applies in place.

    Into another buffer, the copy is one ``np.copyto``: a large copy streams past the
    cache, which block-wise copy-and-patch loops cannot, and patching afterwards touches
    only the changed lines.

    A large delta is patched by up to ``threads`` threads (default: the CPUs this
    process may run on, at most ``MAX_THREADS``), each over its own run of changes. The
    patches wait on memory, not on arithmetic (nearly every change is in a line of its
    own), and one core keeps only so many misses in flight: each core adds its own.
    """
    if out is None:
        out = np.empty(old.shape, dtype=old.dtype)
    elif out.shape != old.shape or out.dtype != old.dtype or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous array of the same shape and dtype as old")
    job = _Patch.of(old, delta)
    if out is not old:
        np.copyto(out, old)
    _patch_all([job.into(out)], threads)
    return out


@dataclass(frozen=True)
class _Patch:
    """A checked delta, ready to patch a tensor; nothing is written until ``_patch_all``."""

    d: _Decoded
    escapes: np.ndarray  # one slot more than the delta's: the lane decoder reads past
    count: int  # changes patched by the kernel; an odd last byte's is set apart
    last_byte: int | None  # the new odd last byte, if the delta changes it
    dst: np.ndarray | None = None  # the raw bytes to patch

    @classmethod
    def of(cls, old: np.ndarray, delta: bytes | memoryview | np.ndarray) -> _Patch:
        d = _decode(delta, old.nbytes)
        count, last_byte = d.gaps.size, None
        if old.nbytes % 2 == 1 and d.last == old.nbytes // 2:
            # the odd last byte is half a lane, zero-padded: it must stay within its byte
            last_byte = (int(_raw_bytes(old)[-1]) + _last_move(d)) & 0xFFFF
            if last_byte > 0xFF:
                raise CorruptError("delta changes a byte past the tensor's odd last byte")
            count -= 1
        escapes = np.empty(d.escapes.size + 1, dtype=np.uint32)
        escapes[:-1] = d.escapes
        escapes[-1] = 0
        return cls(d, escapes, count, last_byte)

    def into(self, out: np.ndarray) -> _Patch:
        return _Patch(self.d, self.escapes, self.count, self.last_byte,
                      out.reshape(-1).view(np.uint8))

    def parts(self, threads: int) -> list[Callable[[], None]]:
        """The patch in runs of changes, about one per thread for a large delta (and the
        odd last byte set, if it changes)."""
        kernels, d, dst = _kernels(), self.d, self.dst
        assert dst is not None, "a patch to apply has its destination"
        if self.last_byte is not None:
            dst[-1] = self.last_byte
        lanes = _lanes(dst)
        n = max(1, min(self.count // _CHANGES_PER_THREAD, threads))
        if n == 1:
            rows = np.array([[0, -1, 0, 0], [self.count, -1, -1, -1]], dtype=np.int64)
        else:
            rows = kernels.split(d.gaps[: self.count], d.escapes, d.codes, n)

        def run(part: int) -> None:
            begin, lane, e, v = (int(x) for x in rows[part])
            kernels.patch(lanes, d.gaps, self.escapes, d.codes, d.values, begin,
                          int(rows[part + 1, 0]), lane, e, v)

        return [functools.partial(run, part) for part in range(n)]


def _patch_all(jobs: list[_Patch], threads: int | None) -> None:
    """Run every job's parts, on up to ``threads`` threads (the caller's among them)."""
    threads = _threads(threads)
    parts = [part for job in jobs for part in job.parts(threads)]
    units, lock = iter(parts), threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                unit = next(units, None)
            if unit is None:
                return
            unit()

    helpers = [_pool().submit(worker) for _ in range(min(threads, len(parts)) - 1)]
    try:
        worker()
    finally:
        for helper in helpers:
            helper.result()


#: most threads one apply uses; fewest changes worth a thread of their own
MAX_THREADS = 8
_CHANGES_PER_THREAD = 1 << 16
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _threads(asked: int | None) -> int:
    if asked is not None:
        if asked < 1:
            raise ValueError(f"threads must be at least 1, not {asked}")
        return min(asked, MAX_THREADS)
    return min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1, MAX_THREADS)


def _pool() -> ThreadPoolExecutor:
    """The threads parallel applies share (their kernels release the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="astraflow-delta")
        return _POOL


@dataclass(frozen=True)
class DeltaFile:
    """A version expressed as deltas against an earlier one; unchanged tensors are omitted."""

    base_version: int
    target_version: int
    layout: dict[str, tuple[str, tuple[int, ...]]]
    blobs: dict[str, np.ndarray]


def layout_of(tensors: Mapping[str, st.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    if isinstance(tensors, st.OnDisk):  # from its header: no tensor read
        return dict(tensors.layout)
    return {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}


def make_delta(base: Mapping[str, st.Tensor], target: Mapping[str, st.Tensor],
               max_bytes: float | None = None) -> dict[str, bytes] | None:
    """Per-tensor deltas of the changed tensors; ValueError if names, dtypes or shapes
    differ. None as soon as the deltas pass ``max_bytes``: the rest is not encoded (nor
    held: at 0.5B parameters a delta refused at the end weighed half a gigabyte)."""
    if layout_of(base) != layout_of(target):
        raise ValueError("tensor names, dtypes or shapes changed; publish a full snapshot")
    blobs = {}
    total = 0
    for name, t in target.items():
        count, blob = _encode(base[name].data, t.data)
        if count:
            blobs[name] = blob
            total += len(blob)
            if max_bytes is not None and total > max_bytes:
                return None
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


def apply_delta_file(tensors: dict[str, st.Tensor], delta: DeltaFile,
                     threads: int | None = None) -> None:
    """Patch ``tensors`` (writable raw bits of version ``delta.base_version``) in place,
    tensors and runs of a large tensor's changes side by side on up to ``threads``."""
    if layout_of(tensors) != delta.layout:
        raise ValueError(f"delta {delta.base_version}->{delta.target_version} expects another "
                         "tensor layout than the local copy")
    # every blob is checked before any tensor is written: a corrupt one refuses the file
    jobs = [_Patch.of(tensors[name].data, blob) for name, blob in delta.blobs.items()]
    _patch_all([job.into(tensors[name].data) for job, name in zip(jobs, delta.blobs,
                                                                  strict=True)], threads)


class Patched(Mapping[str, st.Tensor]):
    """A version rebuilt a tensor at a time: each tensor of ``base`` (e.g. an
    :class:`~astraflow.weights.safetensors_io.OnDisk` file) read when asked for, with the
    ``deltas``' changes to it applied in order. Written with ``st.save``, the new version
    never has more than one tensor in memory. Every blob is checked before its tensor is
    patched; a corrupt one raises CorruptError while the file is written (and an
    ``atomic_file`` leaves nothing behind)."""

    def __init__(self, base: Mapping[str, st.Tensor], deltas: list[DeltaFile]) -> None:
        self.base, self.deltas = base, deltas
        self.layout = layout_of(base)
        for delta in deltas:
            if delta.layout != self.layout:
                raise ValueError(f"delta {delta.base_version}->{delta.target_version} "
                                 "expects another tensor layout than the local copy")

    def __getitem__(self, name: str) -> st.Tensor:
        t = self.base[name]
        data = t.data if t.data.flags.writeable else t.data.copy()
        for delta in self.deltas:
            blob = delta.blobs.get(name)
            if blob is not None:
                _patch_all([_Patch.of(data, blob).into(data)], None)
        return st.Tensor(t.dtype, t.shape, data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout)

    def __len__(self) -> int:
        return len(self.layout)
