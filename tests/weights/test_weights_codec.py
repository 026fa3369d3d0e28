"""The delta codec round-trips bit-exactly and refuses corrupted input."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from astraflow.weights import codec
from astraflow.weights.errors import CorruptError
from astraflow.weights.safetensors_io import Tensor

from .conftest import make_model, same, step


@hs.composite
def pairs(draw):
    """Two raw-bit arrays of one dtype and size, with 0% to 100% of elements changed."""
    dtype = draw(hs.sampled_from([np.uint16, np.uint32]))
    n = draw(hs.one_of(hs.integers(0, 9), hs.integers(10, 3000)))
    changed = draw(hs.floats(0.0, 1.0))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    old = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    new = old.copy()
    hit = rng.random(n) < changed
    new[hit] ^= rng.integers(1, np.iinfo(dtype).max, hit.sum(), dtype=dtype, endpoint=True)
    return old, new


@settings(max_examples=300, deadline=None)
@given(pairs(), hs.sampled_from([2, 4, 1 << 15]))
def test_round_trip_is_bit_exact(pair, chunk_words):
    old, new = pair
    with mock.patch.object(codec, "_CHUNK_WORDS", chunk_words):
        delta = codec.encode_delta(old, new)
        fresh = codec.apply_delta(old, delta)
        into = np.zeros_like(old)
        codec.apply_delta(old, delta, out=into)
        inplace = old.copy()
        codec.apply_delta(inplace, delta, out=inplace)
    for result in (fresh, into, inplace):
        assert result.dtype == new.dtype
        assert np.array_equal(result, new)


def test_unchanged_tensor_gives_header_only_delta():
    old = np.arange(1001, dtype=np.uint16)
    delta = codec.encode_delta(old, old.copy())
    assert len(delta) == codec._HEADER.size
    assert np.array_equal(codec.apply_delta(old, delta), old)


def test_sparse_delta_is_much_smaller_than_the_tensor():
    rng = np.random.default_rng(1)
    old = rng.integers(0, 1 << 16, 1 << 20, dtype=np.uint16)
    new = old.copy()
    hit = rng.choice(old.size, old.size // 100, replace=False)
    new[hit] += 1
    assert len(codec.encode_delta(old, new)) < 0.015 * old.nbytes


@settings(max_examples=200, deadline=None)
@given(pairs(), hs.data())
def test_any_flipped_byte_is_refused(pair, data):
    old, new = pair
    delta = bytearray(codec.encode_delta(old, new))
    position = data.draw(hs.integers(0, len(delta) - 1))
    delta[position] ^= data.draw(hs.integers(1, 255))
    with pytest.raises(CorruptError):
        codec.apply_delta(old, bytes(delta))


@settings(max_examples=50, deadline=None)
@given(pairs(), hs.data())
def test_truncated_delta_is_refused(pair, data):
    old, new = pair
    delta = codec.encode_delta(old, new)
    with pytest.raises(CorruptError):
        codec.apply_delta(old, delta[: data.draw(hs.integers(0, len(delta) - 1))])


def test_delta_for_another_tensor_is_refused():
    delta = codec.encode_delta(np.zeros(8, np.uint16), np.ones(8, np.uint16))
    with pytest.raises(ValueError, match="16 bytes"):
        codec.apply_delta(np.zeros(9, np.uint16), delta)


def test_delta_file_round_trip_over_mixed_dtypes(tmp_path):
    base = make_model()
    target = step(base, seed=1)
    blobs = codec.make_delta(base, target)
    codec.save_delta_file(tmp_path / "d.safetensors", 3, 5, target, blobs)
    delta = codec.load_delta_file(tmp_path / "d.safetensors")
    assert (delta.base_version, delta.target_version) == (3, 5)
    rebuilt = {k: Tensor(t.dtype, t.shape, t.data.copy()) for k, t in base.items()}
    codec.apply_delta_file(rebuilt, delta)
    assert same(rebuilt, target)


def test_delta_needs_the_same_layout():
    base = make_model()
    target = dict(base)
    target.pop("model.norm.weight")
    with pytest.raises(ValueError, match="full snapshot"):
        codec.make_delta(base, target)
