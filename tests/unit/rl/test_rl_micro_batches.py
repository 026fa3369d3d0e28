"""How a batch is cut into micro-batches: by sequences (``micro_batch_size``) and, with
``micro_batch_tokens``, by padded tokens, a group kept whole where the bounds allow."""

from __future__ import annotations

import random

from astraflow.rl.policy_gradient import spans


def _groups(sizes: list[int]) -> list[int]:
    return [g for g, n in enumerate(sizes) for _ in range(n)]


def _check_cover(out: list[tuple[int, int]], n: int) -> None:
    """Every item once, in order, no empty micro-batch."""
    assert [i for start, end in out for i in range(start, end)] == list(range(n))
    assert all(end > start for start, end in out)


def test_without_a_token_budget_each_micro_batch_is_micro_batch_size_sequences() -> None:
    lengths = [5, 500, 7, 9, 1000, 3, 4]
    assert spans(lengths, _groups([7]), 3) == [(0, 3), (3, 6), (6, 7)]


def test_short_sequences_pack_many_to_a_micro_batch_and_long_ones_few() -> None:
    lengths = [10] * 16 + [100] * 16  # 16 groups of 2
    out = spans(lengths, _groups([2] * 16), 64, tokens=200)
    _check_cover(out, len(lengths))
    assert [end - start for start, end in out] == [16] + [2] * 8
    for start, end in out:  # the budget holds: sequences x the longest of them
        assert (end - start) * max(lengths[start:end]) <= 200


def test_a_group_is_not_split_across_micro_batches_when_it_fits_in_one() -> None:
    # 3 groups of 4 at 10 tokens, a budget of 6 sequences: by count alone the second
    # group would be cut 2 + 2 and its prompt computed twice
    out = spans([10] * 12, _groups([4, 4, 4]), 64, tokens=60)
    assert out == [(0, 4), (4, 8), (8, 12)]
    # the sequence cap binds too
    assert spans([10] * 12, _groups([4, 4, 4]), 3, tokens=10_000) == [
        (0, 3), (3, 4), (4, 7), (7, 8), (8, 11), (11, 12)]


def test_a_group_over_the_budget_is_split_and_a_sequence_over_it_goes_alone() -> None:
    lengths = [10, 10, 10, 10, 10, 10, 500, 10, 10]
    out = spans(lengths, _groups([6, 3]), 64, tokens=40)
    _check_cover(out, len(lengths))
    assert out == [(0, 4), (4, 6), (6, 7), (7, 9)]


def test_any_lengths_and_groups_are_covered_within_the_bounds() -> None:
    rng = random.Random(0)
    for _ in range(300):
        sizes = [rng.randint(1, 9) for _ in range(rng.randint(1, 12))]
        lengths = [rng.randint(1, 300) for _ in range(sum(sizes))]
        size, tokens = rng.randint(1, 20), rng.randint(1, 1500)
        out = spans(lengths, _groups(sizes), size, tokens)
        _check_cover(out, len(lengths))
        for start, end in out:
            assert end - start <= size
            assert end - start == 1 or (end - start) * max(lengths[start:end]) <= tokens
