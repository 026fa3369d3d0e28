"""The delta codec round-trips bit-exactly and refuses corrupted input."""

from __future__ import annotations

from unittest import mock

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from weights_helpers import make_model, same, step

from astraflow.weights import codec
from astraflow.weights.errors import CorruptError
from astraflow.weights.safetensors_io import Tensor


@hs.composite
def pairs(draw):
    """Two raw-bit arrays of one dtype and size, with 0% to 100% of elements changed.

    uint8 gives odd byte counts, whose last 16-bit lane is half a lane.
    """
    dtype = draw(hs.sampled_from([np.uint16, np.uint32, np.uint8]))
    n = draw(hs.one_of(hs.integers(0, 9), hs.integers(10, 3000)))
    changed = draw(hs.floats(0.0, 1.0))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    old = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    new = old.copy()
    hit = rng.random(n) < changed
    new[hit] ^= rng.integers(1, np.iinfo(dtype).max, hit.sum(), dtype=dtype, endpoint=True)
    return old, new


# 150 examples: about 0.6 s alone, under the unit tier's 5 s with the other lanes busy
@settings(max_examples=150, deadline=None)
@given(pairs(), hs.sampled_from([1, 32, 1 << 16]), hs.integers(1, 8))
def test_round_trip_is_bit_exact(pair, scratch, threads):
    """Small scratch streams make the encoder stop and resume inside the tensor; with a
    thread per change allowed, applies split the changes between up to 8 threads, each
    starting mid-stream (after gap escapes and escaped moves of other threads)."""
    old, new = pair
    with (mock.patch.object(codec, "_SCRATCH", scratch),
          mock.patch.object(codec, "_CHANGES_PER_THREAD", 1)):
        delta = codec.encode_delta(old, new)
        fresh = codec.apply_delta(old, delta, threads=threads)
        into = np.zeros_like(old)
        codec.apply_delta(old, delta, out=into, threads=threads)
        inplace = old.copy()
        codec.apply_delta(inplace, delta, out=inplace, threads=threads)
    for result in (fresh, into, inplace):
        assert result.dtype == new.dtype
        assert np.array_equal(result, new)


def test_a_large_delta_is_applied_by_several_threads_to_the_same_result():
    """Sparse moves of all kinds (escaped gaps and moves among them), split between
    threads at the default size per thread: the same bits as one thread."""
    rng = np.random.default_rng(7)
    old = rng.integers(0, 1 << 16, 1 << 23, dtype=np.uint16)
    new = old.copy()
    hit = np.unique(rng.integers(0, old.size, 4 * codec._CHANGES_PER_THREAD))
    new[hit] += rng.choice(np.array([1, 0xFFFF, 0xFFFE, 77], np.uint16), hit.size)
    new[-1] ^= 1  # after a gap of thousands of lanes
    delta = codec.encode_delta(old, new)
    kernels = codec._kernels()
    runs = []

    def recorded(dst, gaps, escapes, codes, values, begin, end, *rest):
        runs.append((begin, end))
        return real(dst, gaps, escapes, codes, values, begin, end, *rest)

    real = kernels.patch
    with mock.patch.object(kernels, "patch", recorded):
        for threads in (1, 2, 3):
            runs.clear()
            result = old.copy()
            codec.apply_delta(result, delta, out=result, threads=threads)
            assert np.array_equal(result, new)
            # the runs of changes tile the delta, one per thread
            assert len(runs) == threads
            assert sorted(runs)[0][0] == 0 and sorted(runs)[-1][1] == hit.size + 1
            assert all(a[1] == b[0] for a, b in zip(sorted(runs), sorted(runs)[1:], strict=False))
    with pytest.raises(ValueError, match="threads"):
        codec.apply_delta(old, delta, threads=0)


def test_unchanged_tensor_gives_header_only_delta():
    old = np.arange(1001, dtype=np.uint16)
    delta = codec.encode_delta(old, old.copy())
    assert len(delta) < 100
    assert np.array_equal(codec.apply_delta(old, delta), old)
    assert codec.make_delta({"w": Tensor("BF16", (1001,), old)},
                            {"w": Tensor("BF16", (1001,), old.copy())}) == {}


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


def test_checksummed_delta_pointing_past_the_tensor_is_refused_before_writing():
    """A delta with a valid CRC but positions outside the tensor must not touch memory."""
    old = np.zeros(64, np.uint16)
    new = old.copy()
    new[[3, 63]] = 1
    delta = bytearray(codec.encode_delta(old, new))
    header = codec._HEADER.unpack_from(delta)
    # claim the same payload belongs to a 40-element tensor, and re-seal the checksum
    delta[: codec._HEADER.size] = codec._HEADER.pack(*header[:3], 80, *header[4:])
    start = codec._HEADER.size + codec._CRC.size
    crc = crc32c.crc32c(delta[start:], crc32c.crc32c(delta[: codec._HEADER.size]))
    delta[codec._HEADER.size : start] = codec._CRC.pack(crc)
    victim = np.zeros(40, np.uint16)
    with pytest.raises(CorruptError, match="do not fit"):
        codec.apply_delta(victim, bytes(delta), out=victim)
    assert not victim.any()


def test_gaps_of_four_billion_lanes_are_bridged():
    """Tensors past 8 GiB have gaps that overflow the u32 escape: no-op changes bridge them.

    Driven through the kernels with a far-away first lane, as no test can hold such a
    tensor in memory.
    """
    kernels = codec._kernels()
    old = np.zeros(kernels.BLOCK_LANES, np.uint16)
    new = old.copy()
    new[[0, 4 * 5 + 2]] = [1, 0x0200]
    base = 5 << 32
    slots = kernels.reserve(base + 256) + 8
    gaps, escapes, values = (np.empty(slots, dtype) for dtype in (np.uint8, np.uint32, np.uint16))
    codes = np.zeros(1, np.uint64)
    block, count, n_escapes, n_values, _ = kernels.scan(
        old, new, 0, base, -1, kernels.reserve(base + 256), gaps, escapes, values, codes, 0)
    gaps, escapes, values = gaps[:count], escapes[:n_escapes], values[:n_values]
    assert block == 1
    lanes, moves, lane, e, v = [], [], -1, 0, 0
    for k, gap in enumerate(gaps.tolist()):  # the format, decoded by hand
        if gap == 255:
            gap, e = int(escapes[e]), e + 1
        lane += gap + 1
        zz = int(codes[0]) >> (2 * k) & 3
        if zz == 0:
            zz, v = int(values[v]), v + 1
        lanes.append(lane)
        moves.append((zz >> 1) ^ -(zz & 1))
    changed = [(lane, move) for lane, move in zip(lanes, moves, strict=True) if move]
    # five no-op changes bridge the 5 * 2**32 lanes before the first real one
    assert changed == [(base, 1), (base + 4 * 5 + 2, 0x0200)] and len(lanes) == 7
    # the checks agree on the last lane, and refuse a tensor one lane too short
    assert kernels.check(gaps, escapes, codes, values, base + 4 * 5 + 3) == base + 4 * 5 + 2
    assert kernels.check(gaps, escapes, codes, values, base + 4 * 5 + 2) == -2


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


def test_a_delta_file_with_one_corrupt_tensor_leaves_every_tensor_untouched(tmp_path):
    """Every blob is checked before any tensor is patched: no half-applied version."""
    base = make_model()
    target = step(base, seed=1, fraction=0.3)
    blobs = codec.make_delta(base, target)
    name = sorted(blobs)[-1]
    broken = bytearray(blobs[name])
    broken[-1] ^= 0x40
    blobs[name] = bytes(broken)
    codec.save_delta_file(tmp_path / "d.safetensors", 3, 5, target, blobs)
    held = {k: Tensor(t.dtype, t.shape, t.data.copy()) for k, t in base.items()}
    with pytest.raises(CorruptError):
        codec.apply_delta_file(held, codec.load_delta_file(tmp_path / "d.safetensors"),
                               threads=2)
    assert same(held, base)


def test_delta_needs_the_same_layout():
    base = make_model()
    target = dict(base)
    target.pop("model.norm.weight")
    with pytest.raises(ValueError, match="full snapshot"):
        codec.make_delta(base, target)


def test_a_delta_past_its_budget_stops_encoding():
    """The publisher's budget (half a full snapshot by default): once the deltas pass
    it, none is returned, so a refused delta is not encoded and held to the end."""
    base = make_model()
    target = step(base, seed=1)
    blobs = codec.make_delta(base, target)
    assert blobs
    total = sum(len(b) for b in blobs.values())
    assert codec.make_delta(base, target, max_bytes=total) == blobs
    assert codec.make_delta(base, target, max_bytes=total - 1) is None


def test_a_version_rebuilt_a_tensor_at_a_time_is_the_patched_one(tmp_path):
    """``Patched`` over a file on disk and a chain of two deltas writes the same bytes as
    patching the whole model in memory; a corrupt blob fails the write, leaving no file."""
    from astraflow.weights import safetensors_io as st

    models = [make_model()]
    models += [step(models[0], seed=1)]
    models += [step(models[1], seed=2)]
    st.save(tmp_path / "v0.safetensors", models[0])
    chain = []
    for v in (1, 2):
        codec.save_delta_file(tmp_path / f"d{v}.safetensors", v - 1, v, models[v],
                              codec.make_delta(models[v - 1], models[v]))
        chain.append(codec.load_delta_file(tmp_path / f"d{v}.safetensors"))
    base = st.OnDisk(tmp_path / "v0.safetensors")
    info = st.save(tmp_path / "v2.safetensors", codec.Patched(base, chain))
    assert info == st.digest(models[2])
    assert same(st.load(tmp_path / "v2.safetensors")[0], models[2])
    name = next(iter(chain[1].blobs))
    broken = bytearray(chain[1].blobs[name])
    broken[len(broken) // 2] ^= 0xFF
    chain[1].blobs[name] = np.frombuffer(bytes(broken), dtype=np.uint8)
    with pytest.raises(CorruptError):
        st.save(tmp_path / "bad.safetensors", codec.Patched(base, chain))
    assert not (tmp_path / "bad.safetensors").exists()
