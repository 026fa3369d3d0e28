"""Many sample requests as one batch: one prefill of every prompt, one decode loop.

A recipe sends one request per environment (``num_samples=1`` each, dozens at once);
served one after another, each pays a whole prefill and a decode loop of its own, 4x the
time of the same sequences in one request at Qwen2.5-0.5B's shape (``bench/tinker.py``).
Here the requests waiting for a sampler that share sampling parameters run together:
their distinct prompts (a group's requests share one) left-padded into one prefill,
each request's rows repeated from its prompt's cache, and every decode step drawing
each request's tokens with that request's own generator (its ``seed``), so a request
samples what it would have alone, up to float rounding. A request stops decoding at its
own ``max_tokens`` or stop sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from astraflow_tinker.losses import gather_logprobs


@dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


@dataclass
class SampleRequest:
    prompt: list[int]
    num_samples: int
    max_tokens: int
    seed: int | None = None


def decode(model: Any, device: torch.device, requests: list[SampleRequest],
           temperature: float, top_k: int, top_p: float, stop_ids: set[int],
           stopped: Callable[[list[int]], bool] | None) -> list[list[Sample]]:
    """Each request's samples decoded in one batch on ``model`` (its adapter chosen);
    ``stopped``: whether a row's tokens now end in a stop string."""
    if not requests:
        return []
    generators = [generator_for(device, r.seed) for r in requests]
    owner = [i for i, r in enumerate(requests) for _ in range(r.num_samples)]
    samples = [[Sample([], [], "length") for _ in range(r.num_samples)] for r in requests]
    slot = [j for r in requests for j in range(r.num_samples)]
    with torch.no_grad():
        cache, logits, mask = _prefill(model, device, [r.prompt for r in requests], owner)
        alive = list(range(len(owner)))  # rows still decoding, in the cache's order
        for _ in range(max(r.max_tokens for r in requests)):
            token = torch.empty(len(alive), dtype=torch.long, device=device)
            lps = torch.empty(len(alive), device=device)
            for i, rows in _by_request(alive, owner).items():
                picked, lp = pick(logits[rows], temperature, top_k, top_p, generators[i])
                token[rows], lps[rows] = picked, lp
            keep = []
            for row, (at, tok, lp) in enumerate(zip(alive, token.tolist(), lps.tolist(),
                                                    strict=True)):
                s = samples[owner[at]][slot[at]]
                s.tokens.append(tok)
                s.logprobs.append(lp)
                if tok in stop_ids or (stopped is not None and stopped(s.tokens)):
                    s.stop_reason = "stop"
                elif len(s.tokens) < requests[owner[at]].max_tokens:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(alive):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                token, mask = token[index], mask[index]
                alive = [alive[row] for row in keep]
            mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
            positions = mask.sum(-1, keepdim=True) - 1
            out = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions,
                        past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1].float()
    return samples


def _prefill(model: Any, device: torch.device, prompts: list[list[int]], owner: list[int]
             ) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Each distinct prompt left-padded through one forward (a group's requests share
    theirs); the cache, last logits and attention mask repeated to each request's rows."""
    distinct: dict[tuple[int, ...], int] = {}
    which = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    width = max(len(p) for p in distinct)
    ids = torch.zeros((len(distinct), width), dtype=torch.long)
    mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, p in enumerate(distinct):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    index = torch.tensor([which[request] for request in owner], device=device)
    cache.batch_select_indices(index)
    return cache, out.logits[:, -1].float()[index], mask[index]


def _by_request(alive: list[int], owner: list[int]) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for position, row in enumerate(alive):
        rows.setdefault(owner[row], []).append(position)
    return rows


def generator_for(device: torch.device, seed: int | None) -> torch.Generator:
    """A generator of its own for one request: ``seed``, else a fresh random one."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def pick(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its logprob under ``logits / temperature`` (at
    temperature 1 when greedy), drawn after the top-k and top-p cuts."""
    if temperature <= 0:
        token = logits.argmax(-1)
        return token, gather_logprobs(logits, token)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    cut = logp
    if 0 < top_k < cut.shape[-1]:
        kth = cut.topk(top_k, dim=-1).values[:, -1:]
        cut = cut.masked_fill(cut < kth, -math.inf).log_softmax(-1)
    if top_p < 1:
        ordered, order = cut.sort(dim=-1, descending=True)
        before = ordered.exp().cumsum(-1) - ordered.exp()  # the mass ahead of each token
        ordered = ordered.masked_fill(before >= top_p, -math.inf)
        cut = torch.full_like(cut, -math.inf).scatter(-1, order, ordered)
    token = torch.multinomial(cut.exp(), 1, generator=generator).squeeze(-1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)

