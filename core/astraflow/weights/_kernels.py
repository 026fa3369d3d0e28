"""Compiled single-pass loops of the delta codec.

numpy would need a full-size mask, an index pass and a gather pass; at 99% unchanged
those passes, not the changes, cost the time. The loops here stream their buffers once
and do per-change work only where something changed. A block of 64 lanes is compared in
one vector instruction per register (``_ne_mask``: a lane-wise compare whose result is
read as a 64-bit mask, ``vpcmpneqw`` into a mask register where AVX-512 exists), and the
set bits of the mask are walked with count-trailing-zeros instead of testing every lane.
Importing numba takes about half a second, so ``codec`` imports this module only when a
delta is encoded or applied.

A change is a 16-bit lane of a tensor's raw bytes: the gap to the previous changed lane
(one byte; 255 escapes to a u32 in a side stream) and ``old ^ new`` as a low and a high
byte plane. A gap of 2**32 lanes or more is bridged by no-op changes (XOR 0).
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


def reserve(n_lanes: int) -> int:
    """Output slots ``scan`` keeps free before a block: its changes and no-op bridges."""
    return BLOCK_LANES + (n_lanes >> 32) + 1


@njit(nogil=True, cache=True)
def scan(a: np.ndarray, b: np.ndarray, block: int, lane_base: int, last: int, spare: int,
         gaps: np.ndarray, escapes: np.ndarray, low: np.ndarray, high: np.ndarray
         ) -> tuple[int, int, int, int]:
    """Record the changed lanes of u16 arrays ``a`` vs ``b`` (whole blocks of
    ``BLOCK_LANES``) from block ``block`` on.

    Stops at the end or when fewer than ``spare`` output slots are left; returns (next
    block, changes, escapes, last changed lane) so that the caller resumes with fresh
    arrays.
    """
    cap = gaps.size - spare
    n_blocks = a.size // BLOCK_LANES
    k = 0
    e = 0
    while block < n_blocks and k <= cap:
        first = block * BLOCK_LANES
        mask = _ne_mask(a, b, first)
        while mask != 0:
            j = np.int64(_ctz(mask))
            mask &= mask - np.uint64(1)
            x = a[first + j] ^ b[first + j]
            lane = lane_base + first + j
            gap = lane - last - 1
            while gap > _MAX_GAP:
                gaps[k] = ESCAPE
                escapes[e] = _MAX_GAP
                low[k] = 0
                high[k] = 0
                k += 1
                e += 1
                gap -= _MAX_GAP + 1
            # written unconditionally, kept only if it escapes: a branch taken for
            # one change in thirteen would be mispredicted too often
            escapes[e] = gap
            e += gap >= ESCAPE
            gaps[k] = min(gap, ESCAPE)
            low[k] = x & 0xFF
            high[k] = x >> 8
            last = lane
            k += 1
        block += 1
    return block, k, e, last


@njit(nogil=True, cache=True)
def positions(gaps: np.ndarray, escapes: np.ndarray, limit: int, out: np.ndarray) -> bool:
    """Lanes of the changes into ``out``; False if one reaches ``limit`` or the escapes
    do not add up.

    Runs before anything is written, so a delta that points outside its tensor is
    refused whole instead of half applied.
    """
    e = 0
    lane = np.uint64(0)  # one past the previous change: unsigned, so nothing wraps
    for k in range(gaps.size):
        gap = np.uint64(gaps[k])
        if gap == ESCAPE:
            if e == escapes.size or escapes[e] < ESCAPE:
                return False
            gap = np.uint64(escapes[e])
            e += 1
        if gap >= np.uint64(limit) - lane:
            return False
        out[k] = lane + gap
        lane += gap + np.uint64(1)
    return e == escapes.size


@intrinsic
def _prefetch(typingctx: object, a: types.Array, index: types.Integer) -> tuple:
    """Hint that ``a[index]`` is read soon (prefetcht0); a hint never faults."""
    def codegen(context: object, builder: ir.IRBuilder, signature: object, args: list) -> object:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(data, [args[1]]), byte)
        i32 = ir.IntType(32)
        fn = builder.module.globals.get("llvm.prefetch.p0") or ir.Function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
            name="llvm.prefetch.p0")
        # read, keep in all cache levels, data cache
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(a, types.intp), codegen


#: changes ahead whose lanes ``patch`` asks the cache for
_AHEAD = 64


@njit(nogil=True, cache=True)
def patch(dst: np.ndarray, lanes: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
    """XOR the changes into the (checked) ``lanes`` of u16 array ``dst``.

    At 1% density nearly every change is in another cache line: the loop is bound by
    their misses, and asking for the lines ``_AHEAD`` changes early keeps more of them in
    flight than the out-of-order window does alone (about a fifth less time here).
    """
    n = lanes.size
    for k in range(n):
        if k + _AHEAD < n:
            _prefetch(dst, np.int64(lanes[k + _AHEAD]))
        dst[lanes[k]] ^= low[k] | (np.uint16(high[k]) << np.uint16(8))
