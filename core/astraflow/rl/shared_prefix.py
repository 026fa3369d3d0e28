"""Shared-prefix training: a group's common prompt goes through the model once.

GRPO samples ``group_size`` completions of one prompt, and a trainer that pads each
trajectory to the micro-batch's width runs the prompt through the model once per
sample. With agentic prompts of thousands of tokens and completions of hundreds, that
is most of the step. Here each micro-batch is split in two passes:

1. the prefix pass: one row per group (the tokens every item of the group starts
   with), right-padded, keeping its attention keys and values (the KV cache);
2. the suffix pass: each item's remaining tokens, attending to its group's cached
   prefix (the cache rows are selected per item, so gradients flow back into the one
   prefix computation from every item that used it).

The per-token log-probs (and entropies) of both passes are reassembled into the
``[b, T]`` layout of the plain path, aligned with the tokens as
:func:`astraflow.rl.losses.token_logprobs` is: the loss, the metrics and the
gradients are the plain path's, to float rounding. A micro-batch whose groups share
too little (single samples, or prompts shorter than the completions' padding) keeps the
plain path: :func:`layout` returns None when sharing would not save a fifth of the
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: share only when the two passes cost at most this fraction of the padded plain pass
WORTH = 0.8


@dataclass
class SharedPrefix:
    """How a micro-batch of ``b`` items is split into prefixes and suffixes.

    ``P`` is the longest prefix, ``S`` the longest suffix. Item ``i`` is the tokens
    ``tokens[rows[i], :lengths[i]]`` followed by ``suffix[i, :suffix_mask[i].sum()]``.
    ``index`` maps each position ``j`` of item ``i`` in the plain ``[b, T]`` layout to a
    column of ``[0 | prefix columns (P) | suffix columns (S - 1)]`` (see
    :func:`token_stats`).
    """

    tokens: Tensor  # [G, P] one right-padded prefix per group
    mask: Tensor  # [G, P] 1 on real prefix tokens
    rows: Tensor  # [b] each item's prefix row
    lengths: Tensor  # [b] each item's prefix length (>= 1)
    suffix: Tensor  # [b, S] right-padded, at least one token per item
    suffix_mask: Tensor  # [b, S]
    index: Tensor  # [b, T]

    @property
    def positions(self) -> Tensor:
        """``[b, S]`` position ids of the suffix tokens (each item's own, after its prefix)."""
        width = self.suffix.shape[1]
        return self.lengths[:, None] + torch.arange(width, device=self.suffix.device)[None]

    def attention_mask(self) -> Tensor:
        """``[b, P + S]`` mask of the suffix pass: the item's prefix, then its suffix."""
        return torch.cat([self.mask[self.rows], self.suffix_mask], dim=1)


def layout(token_lists: list[list[int]], groups: list[Any], width: int, pad_token_id: int,
           device: torch.device | str | None = None) -> SharedPrefix | None:
    """The shared-prefix split of one micro-batch, or None where it saves too little.

    Items of the same ``groups`` key share the longest prefix all of them start with,
    but never their last token (each item keeps at least one token to its suffix pass).
    ``width`` is the plain layout's ``T``.
    """
    members: dict[Any, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    prefixes: list[list[int]] = []
    rows = [0] * len(token_lists)
    lengths = [0] * len(token_lists)
    for indices in members.values():
        seqs = [token_lists[i] for i in indices]
        common = min(_common(seqs), min(len(s) for s in seqs) - 1)
        if common < 1:
            return None
        for i in indices:
            rows[i], lengths[i] = len(prefixes), common
        prefixes.append(seqs[0][:common])
    prefix_width = max(len(p) for p in prefixes)
    suffix_width = max(len(t) - n for t, n in zip(token_lists, lengths, strict=True))
    cost = len(prefixes) * prefix_width + len(token_lists) * suffix_width
    if cost > WORTH * len(token_lists) * width:
        return None

    def padded(values: list[int], fill: int, size: int) -> list[int]:
        return list(values) + [fill] * (size - len(values))

    suffixes = [t[n:] for t, n in zip(token_lists, lengths, strict=True)]
    length = torch.tensor(lengths, device=device)
    j = torch.arange(width, device=device)[None]
    last = prefix_width + suffix_width - 1
    return SharedPrefix(
        tokens=torch.tensor([padded(p, pad_token_id, prefix_width) for p in prefixes],
                            device=device),
        mask=torch.tensor([padded([1] * len(p), 0, prefix_width) for p in prefixes],
                          device=device),
        rows=torch.tensor(rows, device=device),
        lengths=length,
        suffix=torch.tensor([padded(s, pad_token_id, suffix_width) for s in suffixes],
                            device=device),
        suffix_mask=torch.tensor([padded([1] * len(s), 0, suffix_width) for s in suffixes],
                                 device=device),
        index=torch.where(j <= length[:, None], j,
                          prefix_width + j - length[:, None]).clamp(max=last),
    )


def _common(seqs: list[list[int]]) -> int:
    """The length of the prefix every list starts with: that of the (lexicographically)
    least and greatest, which differ first where any two do."""
    low, high = min(seqs), max(seqs)
    for n, (a, b) in enumerate(zip(low, high, strict=False)):
        if a != b:
            return n
    return min(len(low), len(high))


def _entropy(logits: Tensor) -> Tensor:
    """``[n, K]`` entropies of ``[n, K, V]`` logits, a row at a time (three ``[K, V]``
    float32 temporaries, not three of the whole)."""
    if logits.shape[0] == 0 or logits.shape[1] == 0:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    rows = []
    for row in logits:
        logp = torch.log_softmax(row.float(), dim=-1)
        rows.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(rows)


def prefix_columns(split: SharedPrefix, mask: Tensor) -> Tensor:
    """The prefix columns whose logits a loss over ``mask``'s tokens (``[b, T]``, the
    plain layout) reads: each item's last prefix column (it predicts the item's first
    suffix token) and any column predicting a trained token inside the prefix. A GRPO
    prompt is never trained, so of a 200-token prompt's 200 columns one is needed."""
    width = split.tokens.shape[1]
    columns = torch.arange(width, device=mask.device)[None]
    inside = mask[:, 1 : width + 1].bool() & (columns < split.lengths[:, None] - 1)
    used = inside.any(dim=0)
    used[split.lengths - 1] = True
    return used.nonzero().squeeze(1)


def token_stats(prefix_logits: Tensor, suffix_logits: Tensor, split: SharedPrefix,
                entropy: bool = False, kept: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and entropies, without gradient) ``[b, T]`` of the items,
    from the two passes' logits (``[G, P, V]`` and ``[b, S, V]``); column 0 is 0.0.

    Prefix column ``c`` of an item predicts its token ``c + 1``: inside the group's
    prefix that is the prefix's own next token; at the item's last prefix column it is
    the item's first suffix token. Suffix column ``k`` predicts suffix token ``k + 1``.

    ``kept``: the prefix columns ``prefix_logits`` holds (``[G, K, V]``), as
    :func:`prefix_columns` gives them; the others' log-probs are 0.0.
    """
    groups, width = split.tokens.shape
    prefix = prefix_logits.float()
    cols = torch.arange(width, device=prefix.device) if kept is None else kept
    norm = torch.logsumexp(prefix, dim=-1)  # [G, K]
    following = torch.nn.functional.pad(split.tokens[:, 1:], (0, 1))[:, cols]
    inner = prefix.gather(-1, following[..., None]).squeeze(-1) - norm
    inner = prefix.new_zeros(groups, width).index_copy(1, cols, inner)  # [G, P]
    last = torch.searchsorted(cols, split.lengths - 1)  # each item's last column, in K
    first = (prefix[split.rows, last].gather(-1, split.suffix[:, :1]).squeeze(-1)
             - norm[split.rows, last])  # [b]
    columns = torch.arange(width, device=prefix.device)[None]
    own = torch.where(columns == (split.lengths - 1)[:, None], first[:, None],
                      inner[split.rows])
    rest = suffix_logits[:, :-1].float()
    after = (rest.gather(-1, split.suffix[:, 1:, None]).squeeze(-1)
             - torch.logsumexp(rest, dim=-1))  # [b, S - 1]
    zero = own.new_zeros(own.shape[0], 1)
    logp = torch.cat([zero, own, after], dim=1).gather(1, split.index)
    if not entropy:
        return logp, None
    with torch.no_grad():
        spread = prefix.new_zeros(groups, width).index_copy(1, cols, _entropy(prefix_logits))
        spread = torch.cat([zero, spread[split.rows], _entropy(suffix_logits[:, :-1])], dim=1)
        return logp, spread.gather(1, split.index)
