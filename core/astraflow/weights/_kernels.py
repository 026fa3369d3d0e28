"""Compiled single-pass loops of the delta codec.

numpy would need a full-size mask, an index pass and a gather pass; at 99% unchanged
those passes, not the changes, cost the time. The loops here stream their buffers once
and do per-change work only where something changed. A block of 64 lanes is compared in
one vector instruction per register (``_ne_mask``: a lane-wise compare whose result is
read as a 64-bit mask, ``vpcmpneqw`` into a mask register where AVX-512 exists), and the
set bits of the mask are walked with count-trailing-zeros instead of testing every lane.
Both buffers are prefetched 4 KiB ahead of the compare (hardware prefetchers do not
cross 4 KiB pages; with the hints the scan takes a fifth less time).
Importing numba takes about half a second, so ``codec`` imports this module only when a
delta is encoded or applied.

A change is a 16-bit lane of a tensor's raw bytes: the gap to the previous changed lane
(one byte; 255 escapes to a u32 in a side stream) and a 2-bit code for how the lane's
integer moved. Under bf16 (and f16) a one-ulp step of a value is +-1 on its bit pattern,
so the move is coded zigzag (``zz = (d << 1) ^ (d >> 15)`` of the 16-bit difference
``d = new - old``): codes 1..3 are zz itself (-1, +1, -2), code 0 escapes to a u16 zz in
a side stream. A gap of 2**32 lanes or more is bridged by no-op changes (zz 0).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

#: u16 lanes compared per block; one block yields at most as many changes
BLOCK_LANES = 64
ESCAPE = 255
_MAX_GAP = 0xFFFFFFFF


@intrinsic
def _ctz(typingctx: object, value: types.Integer) -> tuple:
    """Trailing zero bits of a non-zero integer: one instruction (tzcnt)."""
    def codegen(context: object, builder: ir.IRBuilder, signature: object, args: list) -> object:
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))
    return value(value), codegen


@intrinsic
def _ne_mask(typingctx: object, a: types.Array, b: types.Array, start: types.Integer) -> tuple:
    """Bit i set where lanes ``a[start + i]`` and ``b[start + i]`` differ, i < 64.

    The caller guarantees 64 lanes from ``start`` in both (C-contiguous u16) arrays.
    """
    def codegen(context: object, builder: ir.IRBuilder, signature: object, args: list) -> object:
        vector = ir.VectorType(ir.IntType(16), BLOCK_LANES)
        loaded = []
        for ty, array in zip(signature.args[:2], args[:2], strict=True):
            data = context.make_array(ty)(context, builder, array).data
            ptr = builder.bitcast(builder.gep(data, [args[2]]), vector.as_pointer())
            loaded.append(builder.load(ptr, align=1))  # any address: views may be odd
        differ = builder.icmp_unsigned("!=", *loaded)
        return builder.bitcast(differ, ir.IntType(BLOCK_LANES))
    return types.uint64(a, b, types.intp), codegen


def _prefetcher(locality: int, doc: str) -> object:
    """An intrinsic hinting that ``a[index]`` is read soon, into the cache levels that
    ``locality`` names (LLVM's: 3 all of them, 2 L2 and outer); a hint never faults."""
    @intrinsic
    def prefetch(typingctx: object, a: types.Array, index: types.Integer) -> tuple:
        def codegen(context: object, builder: ir.IRBuilder, signature: object,
                    args: list) -> object:
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            byte = ir.IntType(8).as_pointer()
            ptr = builder.bitcast(builder.gep(data, [args[1]]), byte)
            i32 = ir.IntType(32)
            fn = builder.module.globals.get("llvm.prefetch.p0") or ir.Function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
                name="llvm.prefetch.p0")
            # read, locality, data cache
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.void(a, types.intp), codegen
    prefetch.__doc__ = doc
    return prefetch


_prefetch = _prefetcher(3, "Hint that ``a[index]`` is read soon (prefetcht0).")
_prefetch_l2 = _prefetcher(
    2, "Hint that ``a[index]`` is read, from L2 or further (prefetcht1): unlike an L1 "
    "hint, it holds none of the L1 cache's miss buffers while the line is on its way.")


#: lanes (4 KiB) ahead of its compare that the scan asks the cache for
_SCAN_AHEAD = 2048


def reserve(n_lanes: int) -> int:
    """Output slots ``scan`` keeps free before a block: its changes and no-op bridges."""
    return BLOCK_LANES + (n_lanes >> 32) + 1


@njit(nogil=True, cache=True)
def scan(a: np.ndarray, b: np.ndarray, block: int, lane_base: int, last: int, spare: int,
         gaps: np.ndarray, escapes: np.ndarray, values: np.ndarray, codes: np.ndarray,
         done: int) -> tuple[int, int, int, int, int]:
    """Record the changed lanes of u16 arrays ``a`` vs ``b`` (whole blocks of
    ``BLOCK_LANES``) from block ``block`` on.

    ``gaps``, ``escapes``, ``values`` (escaped zz) and ``codes`` (32 per u64, zeroed
    past the first ``done`` codes, which the caller carried over) are this round's
    scratch. Stops at the end or when fewer than ``spare`` gap slots are left; returns
    (next block, changes, gap escapes, value escapes, last changed lane).
    """
    cap = gaps.size - spare
    n_blocks = a.size // BLOCK_LANES
    k = 0
    e = 0
    v = 0
    while block < n_blocks and k <= cap:
        first = block * BLOCK_LANES
        # both lines of both arrays, 4 KiB ahead: a fifth less time at 1% density (a
        # block or two ahead gained little; 4 to 16 KiB ahead all about the same). Past
        # the end the hint is dropped: a prefetch never faults.
        ahead = first + _SCAN_AHEAD
        _prefetch(a, ahead)
        _prefetch(a, ahead + BLOCK_LANES // 2)
        _prefetch(b, ahead)
        _prefetch(b, ahead + BLOCK_LANES // 2)
        mask = _ne_mask(a, b, first)
        while mask != 0:
            j = np.int64(_ctz(mask))
            mask &= mask - np.uint64(1)
            lane = lane_base + first + j
            gap = lane - last - 1
            while gap > _MAX_GAP:
                gaps[k] = ESCAPE
                escapes[e] = _MAX_GAP
                values[v] = 0  # zz 0: no move
                k += 1
                e += 1
                v += 1
                gap -= _MAX_GAP + 1
            # written unconditionally, kept only if it escapes: a branch taken for
            # one change in thirteen would be mispredicted too often
            escapes[e] = gap
            e += gap >= ESCAPE
            gaps[k] = min(gap, ESCAPE)
            d = np.int16(b[first + j] - a[first + j])
            zz = np.uint16((d << np.int16(1)) ^ (d >> np.int16(15)))
            code = zz if zz <= 3 else np.uint16(0)
            values[v] = zz
            v += code == 0
            c = done + k
            codes[c >> 5] |= np.uint64(code) << np.uint64(2 * (c & 31))
            last = lane
            k += 1
        block += 1
    return block, k, e, v, last


@intrinsic
def _popcount(typingctx: object, value: types.Integer) -> tuple:
    """Set bits of an integer: one instruction (popcnt)."""
    def codegen(context: object, builder: ir.IRBuilder, signature: object, args: list) -> object:
        return builder.ctpop(args[0])
    return value(value), codegen


@njit(nogil=True, cache=True)
def _gap_sums(gaps: np.ndarray, begin: int, end: int) -> tuple:
    """(sum, count of 255s) of ``gaps[begin:end]``, eight bytes at a time where ``begin``
    is a multiple of 8 (exact: no carries cross bytes in either expression)."""
    total = np.uint64(0)
    n_escapes = 0
    words = (end - begin) // 8 if begin % 8 == 0 else 0
    word_view = gaps[begin : begin + words * 8].view(np.uint64)
    low7 = np.uint64(0x7F7F7F7F7F7F7F7F)
    evens = np.uint64(0x00FF00FF00FF00FF)
    for w in range(words):
        x = word_view[w]
        pairs = (x & evens) + ((x >> np.uint64(8)) & evens)  # four u16 sums
        total += (pairs * np.uint64(0x0001000100010001)) >> np.uint64(48)
        inv = ~x  # a 255 byte is a zero byte of ~x
        zero = ~(((inv & low7) + low7) | inv | low7)
        n_escapes += _popcount(zero)
    for k in range(begin + words * 8, end):
        total += np.uint64(gaps[k])
        n_escapes += gaps[k] == ESCAPE
    return total, n_escapes


@njit(nogil=True, cache=True)
def _escaped_codes(codes: np.ndarray, first_word: int, end_word: int) -> int:
    """How many 2-bit codes are 0 (an escaped move) in ``codes[first_word:end_word]``."""
    zeros = 0
    for w in range(first_word, end_word):
        word = codes[w]
        nonzero = (word | (word >> np.uint64(1))) & np.uint64(0x5555555555555555)
        zeros += 32 - _popcount(nonzero)
    return zeros


@njit(nogil=True, cache=True)
def check(gaps: np.ndarray, escapes: np.ndarray, codes: np.ndarray, values: np.ndarray,
          limit: int) -> int:
    """The lane of the last change (-1: none), or -2 if a change would reach ``limit``
    or the side streams do not match the gaps and codes.

    Lanes only ascend, so the last one bounds them all: the check is a sum over the gap
    bytes. It runs before anything is written, so a delta that does not fit is refused
    whole instead of half applied.
    """
    total, n_escapes = _gap_sums(gaps, 0, gaps.size)
    total -= np.uint64(ESCAPE) * np.uint64(n_escapes)
    if n_escapes != escapes.size:
        return -2
    for e in range(escapes.size):
        if escapes[e] < ESCAPE:
            return -2
        total += np.uint64(escapes[e])
    end = total + np.uint64(gaps.size)  # one past the last change (no wrap: < 2**64)
    if end > np.uint64(limit):
        return -2
    # code 0 (escaped value) count, two bits at a time; unused codes past the end are 0
    n = gaps.size
    if codes.size != (n + 31) // 32:
        return -2
    zeros = _escaped_codes(codes, 0, codes.size)
    pad = codes.size * 32 - n
    if pad and codes[codes.size - 1] >> np.uint64(2 * (32 - pad)) != 0:
        return -2
    if zeros - pad != values.size:
        return -2
    return np.int64(end) - 1


@njit(nogil=True, cache=True)
def split(gaps: np.ndarray, escapes: np.ndarray, codes: np.ndarray, parts: int) -> np.ndarray:
    """Where ``parts`` threads each start patching a ``check``-ed delta: one row per part,
    (first change, lane of the change before it or -1, gap escapes and escaped moves
    before it), and a last row (count, -1, -1, -1).

    Parts start at multiples of 32 changes, whole words of codes; a sum over the gap
    bytes and a popcount over the codes before each, one pass over the delta in all.
    """
    count = gaps.size
    rows = np.full((parts + 1, 4), -1, dtype=np.int64)
    lane, e, v, k = np.int64(-1), 0, 0, 0
    for part in range(parts):
        first = (count * part // parts) & ~31
        total, n_escapes = _gap_sums(gaps, k, first)
        lane += np.int64(total) - ESCAPE * n_escapes + (first - k)
        for j in range(e, e + n_escapes):
            lane += np.int64(escapes[j])
        e += n_escapes
        v += _escaped_codes(codes, k >> 5, first >> 5)
        rows[part, 0], rows[part, 1], rows[part, 2], rows[part, 3] = first, lane, e, v
        k = first
    rows[parts, 0] = count
    return rows


#: changes decoded (and their lines asked for) in one go before the patches of the
#: previous chunk; see ``patch``
CHUNK = 256


@njit(nogil=True, cache=True)
def patch(dst: np.ndarray, gaps: np.ndarray, escapes: np.ndarray, codes: np.ndarray,
          values: np.ndarray, begin: int, end: int, lane: int, e: int, v: int) -> None:
    """Add changes ``begin`` to ``end`` of a ``check``-ed delta to u16 array ``dst``;
    ``lane`` is that of the change before ``begin`` (-1: none), ``e`` and ``v`` the gap
    escapes and escaped moves before it (``split``). ``escapes`` holds one more (unused)
    slot than the delta's gap escapes.

    At 1% density nearly every change is in another cache line, so the patches are
    bound by their misses, and what counts is how many are in flight at once. The
    changes go in chunks of ``CHUNK``: a chunk's lanes and moves are decoded into a
    small table, each lane's line asked of the L2 cache as it is decoded, and then the
    previous chunk, whose lines have arrived by now, is patched from its table. Asked
    of L2 (``_prefetch_l2``), the lines do not hold the L1 cache's few miss buffers,
    so many more misses overlap; asking L1, or interleaving each ask with a patch some
    changes later, left the loop at the L1 limit. On a 2-core AMD EPYC (1 GiB, 1%
    changed) the patch took 25 ms this way against 59 ms for a decoder running 16
    changes ahead of the patches with L1 asks, 42 ms for the same with L2 asks at any
    lead, and 49 ms for numpy's ``a[idx] = values``.
    """
    lanes = np.empty(2 * CHUNK, dtype=np.int64)
    moves = np.empty(2 * CHUNK, dtype=np.int16)
    lane = np.int64(lane)
    previous = 0  # changes in the table half not yet patched
    half = 0
    start = begin
    while True:
        stop = min(start + CHUNK, end)
        at = half * CHUNK
        for k in range(start, stop):
            # without a branch: one gap in thirteen escapes, too often to predict
            gap = np.int64(gaps[k])
            escaped = gap == ESCAPE
            gap = np.int64(escapes[e]) if escaped else gap
            e += escaped
            lane += gap + 1
            _prefetch_l2(dst, lane)
            lanes[at] = lane
            zz = np.uint16((codes[k >> 5] >> np.uint64(2 * (k & 31))) & np.uint64(3))
            if zz == 0:
                zz = values[v]
                v += 1
            moves[at] = np.int16(np.int64(zz >> np.uint16(1)) ^ -np.int64(zz & np.uint16(1)))
            at += 1
        half ^= 1
        at = half * CHUNK
        for j in range(at, at + previous):
            i = lanes[j]
            dst[i] = np.uint16((np.int64(dst[i]) + moves[j]) & 0xFFFF)
        if start >= end:
            return
        previous = stop - start
        start = stop
