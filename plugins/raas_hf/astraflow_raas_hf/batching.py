"""How ``raas=hf`` cuts a batch of requests into forward passes (torch-free)."""

from __future__ import annotations


def chunks(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """The indices of rows whose prompts are ``lengths`` long, in order, cut into batches
    of at most ``max_rows`` rows and ``max_tokens`` padded prompt tokens (rows x the
    longest prompt; a longer prompt runs alone)."""
    out: list[list[int]] = []
    width = 0
    for i, length in enumerate(lengths):
        wider = max(width, length)
        if out and len(out[-1]) < max_rows and wider * (len(out[-1]) + 1) <= max_tokens:
            out[-1].append(i)
            width = wider
        else:
            out.append([i])
            width = length
    return out
