"""Keys and values of recent long prompts, kept for the next prompt that extends one.

An agent harness re-sends its whole conversation every turn: Claude Code's and Codex's
first prompts are 26-35k tokens of instructions and tool schemas, and each later turn is
the last one plus the reply and a tool result. ``raas=hf`` keeps the KV cache a
generation ends with (its prompt and what it sampled) under those token ids; a prompt
that starts with the ids of a kept one runs only its new tokens. Entries are a weight
version's: a new version makes them stale, and they are dropped.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any


def common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    lo, hi = 0, n  # the longest shared length, by halves: slices compare in C
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == tuple(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def cache_bytes(cache: Any) -> int:
    """The bytes of a ``transformers`` cache's keys and values."""
    layers = getattr(cache, "layers", None) or []
    return sum(int(t.nbytes) for layer in layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
               if t is not None and hasattr(t, "nbytes"))


class PrefixCache:
    """LRU entries ``ids -> KV cache`` of one weight version, at most ``max_bytes`` of
    keys and values in all; only prompts of at least ``min_tokens`` ids are kept."""

    def __init__(self, max_bytes: int, min_tokens: int) -> None:
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self.version: int | None = None
        self._entries: OrderedDict[tuple[int, ...], tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def _at(self, version: int) -> None:
        if version != self.version:
            self._entries.clear()
            self.bytes, self.version = 0, version

    def take(self, ids: list[int], version: int) -> tuple[int, Any] | None:
        """``(n, cache)``: a copy of the kept cache sharing the most leading ids with
        ``ids`` (at least ``min_tokens``), cut to ``n`` of them (never all of ``ids``:
        the last one must run to give the next token's logits); None when none does."""
        self._at(version)
        if len(ids) < self.min_tokens or not self._entries:
            self.misses += len(ids) >= self.min_tokens
            return None
        best, shared = None, 0
        for key in self._entries:
            n = common_prefix(key, ids)
            if n > shared:
                best, shared = key, n
        shared = min(shared, len(ids) - 1)
        if best is None or shared < self.min_tokens:
            self.misses += 1
            return None
        self._entries.move_to_end(best)
        cache = copy.deepcopy(self._entries[best][0])
        extra = cache.get_seq_length() - shared
        if extra > 0:  # a negative crop drops that many of the last positions
            cache.crop(-extra)
        self.hits += 1
        return shared, cache

    def put(self, ids: tuple[int, ...], cache: Any, version: int) -> None:
        """Keep ``cache`` (covering exactly ``ids``), dropping the oldest past the budget."""
        self._at(version)
        size = cache_bytes(cache)
        if len(ids) < self.min_tokens or size > self.max_bytes:
            return
        if ids in self._entries:
            self.bytes -= self._entries.pop(ids)[1]
        # an entry that the new one extends is no use any more: the new one serves it
        for key in [k for k in self._entries if len(k) < len(ids) and ids[:len(k)] == k]:
            self.bytes -= self._entries.pop(key)[1]
        self._entries[ids] = (cache, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
