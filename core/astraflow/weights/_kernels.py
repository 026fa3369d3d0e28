"""Compiled single-pass loops of the delta codec.

numpy would need a full-size mask, an index pass and a gather pass; at 99% unchanged
those passes, not the changes, cost the time. The loops here stream their buffers once
and do per-change work only where something changed. Inside a block they walk set bits
(count trailing zeros) instead of testing every word: one mispredicted branch per word
would cost more than the change itself. Importing numba takes about half a second, so
``codec`` imports this module only when a delta is encoded or applied.

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

#: u64 words compared per block (8 cache lines); one block yields at most 4x as many changes
BLOCK_WORDS = 64
ESCAPE = 255
_MAX_GAP = 0xFFFFFFFF


@intrinsic
def _ctz(typingctx: object, value: types.Integer) -> tuple:
    """Trailing zero bits of a non-zero integer: one instruction (tzcnt)."""
    def codegen(context: object, builder: ir.IRBuilder, signature: object, args: list) -> object:
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))
    return value(value), codegen


def reserve(n_lanes: int) -> int:
    """Output slots ``scan`` keeps free before a block: its changes and no-op bridges."""
    return 4 * BLOCK_WORDS + (n_lanes >> 32) + 1


@njit(nogil=True, cache=True)
def scan(a: np.ndarray, b: np.ndarray, row: int, lane_base: int, last: int, spare: int,
         gaps: np.ndarray, escapes: np.ndarray, low: np.ndarray, high: np.ndarray
         ) -> tuple[int, int, int, int]:
    """Record the changed lanes of ``a`` vs ``b`` (u64, one block per row) from ``row`` on.

    Stops at the end or when fewer than ``spare`` output slots are left; returns (next
    row, changes, escapes, last changed lane) so that the caller resumes with fresh
    arrays.
    """
    cap = gaps.size - spare
    k = 0
    e = 0
    while row < a.shape[0] and k <= cap:
        ra = a[row]
        rb = b[row]
        words = np.uint64(0)
        for j in range(BLOCK_WORDS):
            words |= np.uint64(ra[j] != rb[j]) << np.uint64(j)
        while words != 0:
            j = _ctz(words)
            words &= words - np.uint64(1)
            x = ra[j] ^ rb[j]
            lane0 = lane_base + 4 * (BLOCK_WORDS * row + np.int64(j))
            while x != 0:
                bit = _ctz(x)
                shift = bit & np.uint64(48)
                lane = lane0 + np.int64(bit >> np.uint64(4))
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
                value = x >> shift
                low[k] = value & np.uint64(0xFF)
                high[k] = (value >> np.uint64(8)) & np.uint64(0xFF)
                x &= ~(np.uint64(0xFFFF) << shift)
                last = lane
                k += 1
        row += 1
    return row, k, e, last


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


@njit(nogil=True, cache=True)
def patch(dst: np.ndarray, lanes: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
    """XOR the changes into the (checked) ``lanes`` of u16 array ``dst``."""
    for k in range(lanes.size):
        dst[lanes[k]] ^= low[k] | (np.uint16(high[k]) << np.uint16(8))
