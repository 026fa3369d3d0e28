"""Routed experts (router replay): what an engine records and a trainer replays.

A mixture-of-experts layer sends each token to the ``top_k`` experts its router scores
highest. The rollout engine and the trainer compute those scores with different kernels
and precisions, so for some tokens they choose different experts, and the trainer's
log-probs are then those of another network than the one that sampled. With router
replay (``trainer.router_replay=true``) the engine records, for every position it ran, the
experts of every MoE layer; the trajectory carries them (:class:`~astraflow.types.RoutedExperts`,
one byte per choice), and the trainer's forward sends each token to the same experts,
weighting them by its own router's probabilities (so the router still trains).

Arrays here are numpy ``[positions, layers, top_k]``; :data:`NOT_ROUTED` marks a position
nobody routed, which the trainer leaves to its own router.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from astraflow.types import NOT_ROUTED, RoutedExperts

__all__ = ["NOT_ROUTED", "RoutedExperts", "extend", "from_array", "to_array"]


def _dtype(wide: bool) -> np.dtype:
    return np.dtype("<u2" if wide else "u1")


def to_array(routed: RoutedExperts) -> np.ndarray:
    """``[positions, layers, top_k]`` (uint8 or uint16)."""
    flat = np.frombuffer(routed.experts, _dtype(routed.wide))
    return flat.reshape(-1, routed.layers, routed.top_k)


def from_array(experts: np.ndarray | Sequence, num_experts: int | None = None
               ) -> RoutedExperts:
    """From ``[positions, layers, top_k]`` expert indices; negative entries are
    :data:`NOT_ROUTED`. ``num_experts`` over 255 (or an index over 254) makes it wide."""
    arr = np.asarray(experts, dtype=np.int64)
    if arr.ndim != 3:
        raise ValueError(f"routed experts must be [positions, layers, top_k], got {arr.shape}")
    top = int(arr.max()) if arr.size else 0
    wide = (num_experts or 0) > NOT_ROUTED[False] or top >= NOT_ROUTED[False]
    if top >= NOT_ROUTED[True]:
        raise ValueError(f"expert index {top} does not fit routed experts (< 65535)")
    filled = np.where(arr < 0, NOT_ROUTED[wide], arr).astype(_dtype(wide))
    return RoutedExperts(int(arr.shape[1]), int(arr.shape[2]), filled.tobytes(), wide)


def extend(routed: RoutedExperts, positions: int) -> RoutedExperts:
    """``routed`` cut or padded with :data:`NOT_ROUTED` to ``positions`` positions."""
    have = routed.positions
    if have >= positions:
        return routed.head(positions)
    row = np.full((positions - have, routed.layers, routed.top_k), NOT_ROUTED[routed.wide],
                  _dtype(routed.wide))
    return RoutedExperts(routed.layers, routed.top_k, routed.experts + row.tobytes(),
                         routed.wide)


def signed(routed: RoutedExperts) -> np.ndarray:
    """``[positions, layers, top_k]`` int64, -1 where nobody routed (the trainer's form)."""
    arr = to_array(routed).astype(np.int64)
    arr[arr == NOT_ROUTED[routed.wide]] = -1
    return arr
