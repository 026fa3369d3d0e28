"""Delta codec benchmark: >= 1 GiB of bf16 weights with 99% of elements unchanged.

Everything is measured in the same run on the same buffers: our encode/apply, the
reference algorithm (compare as uint16, np.where, u32 indices + raw bf16 values behind
a 16-byte ``<QHHi`` header), and a plain memcpy of the buffer as the bandwidth limit.
Changed elements move by one unit in the last place, as bf16 RL updates do; the payload
of the same positions with random new values is reported too (the incompressible case).

Usage: python bench/weights.py [--gib 1.0] [--repeat 3]; writes bench/results/weights.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from astraflow.weights.codec import apply_delta, encode_delta

RESULTS = Path(__file__).parent / "results" / "weights.json"


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def make_buffers(n: int, changed: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """bf16 bits of N(0, 0.02) weights, and a copy where ``changed`` of them moved one ulp."""
    rng = np.random.default_rng(seed)
    old = np.empty(n, dtype=np.uint16)
    step = 1 << 26
    for start in range(0, n, step):
        values = rng.normal(0, 0.02, min(step, n - start)).astype(np.float32)
        old[start : start + values.size] = (values.view(np.uint32) >> 16).astype(np.uint16)
    new = old.copy()
    positions = np.unique(rng.integers(0, n, int(n * changed * 1.005)))
    new[positions] += rng.choice(np.array([1, 0xFFFF], dtype=np.uint16), positions.size)
    return old, new


def reference_encode(old: np.ndarray, new: np.ndarray) -> bytes:
    idx = np.where(old.view(np.uint16) != new.view(np.uint16))[0].astype(np.uint32)
    header = struct.pack("<QHHi", idx.size, 2, 0, 0)
    return header + idx.tobytes() + new[idx].tobytes()


def reference_apply(old: np.ndarray, delta: bytes, out: np.ndarray | None) -> np.ndarray:
    count, _, flags, _ = struct.unpack_from("<QHHi", delta)
    width = 8 if flags & 1 else 4
    idx = np.frombuffer(delta, dtype=f"<u{width}", count=count, offset=16)
    values = np.frombuffer(delta, dtype="<u2", count=count, offset=16 + width * count)
    if out is None:
        out = old.copy()
    elif out is not old:
        np.copyto(out, old)
    out[idx] = values
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = int(args.gib * (1 << 30)) // 2
    old, new = make_buffers(n, args.changed)
    nbytes = old.nbytes
    unchanged = 1 - np.count_nonzero(old != new) / n
    out = np.empty_like(old)

    t_memcpy, _ = best_of(args.repeat, lambda: np.copyto(out, old))
    t_enc, delta = best_of(args.repeat, lambda: encode_delta(old, new))
    t_ref_enc, ref = best_of(args.repeat, lambda: reference_encode(old, new))
    t_apply, _ = best_of(args.repeat, lambda: apply_delta(old, delta, out=out))
    assert np.array_equal(out, new)
    t_ref_apply, _ = best_of(args.repeat, lambda: reference_apply(old, ref, out))
    assert np.array_equal(out, new)
    t_apply_new, result = best_of(args.repeat, lambda: apply_delta(old, delta))
    assert np.array_equal(result, new)
    t_ref_apply_new, result = best_of(args.repeat, lambda: reference_apply(old, ref, None))
    assert np.array_equal(result, new)
    del result
    np.copyto(out, old)
    t_inplace, _ = best_of(1, lambda: apply_delta(out, delta, out=out))
    assert np.array_equal(out, new)
    np.copyto(out, old)
    t_ref_inplace, _ = best_of(1, lambda: reference_apply(out, ref, out))
    assert np.array_equal(out, new)

    random_new = old.copy()
    moved = np.flatnonzero(old != new)
    random_new[moved] = np.random.default_rng(1).integers(0, 1 << 16, moved.size,
                                                          dtype=np.uint16)
    random_new[moved] += (random_new[moved] == old[moved]).astype(np.uint16)
    random_delta = encode_delta(old, random_new)

    gbps = lambda t: nbytes / t / 1e9  # noqa: E731
    results = {
        "buffer_bytes": nbytes, "dtype": "BF16", "unchanged_fraction": unchanged,
        "repeat": args.repeat, "machine": platform.processor() or platform.machine(),
        "numpy": np.__version__,
        "memcpy_gbps": gbps(t_memcpy),
        "encode_gbps": gbps(t_enc), "reference_encode_gbps": gbps(t_ref_enc),
        "apply_into_buffer_gbps": gbps(t_apply),
        "reference_apply_into_buffer_gbps": gbps(t_ref_apply),
        "apply_new_array_gbps": gbps(t_apply_new),
        "reference_apply_new_array_gbps": gbps(t_ref_apply_new),
        "apply_in_place_gbps": gbps(t_inplace),
        "reference_apply_in_place_gbps": gbps(t_ref_inplace),
        "encode_speedup_vs_reference": t_ref_enc / t_enc,
        "apply_speedup_vs_reference_into_buffer": t_ref_apply / t_apply,
        "apply_speedup_vs_reference_new_array": t_ref_apply_new / t_apply_new,
        "apply_speedup_vs_reference_in_place": t_ref_inplace / t_inplace,
        "encode_vs_memcpy": t_memcpy / t_enc,
        "payload_fraction": len(delta) / nbytes,
        "reference_payload_fraction": len(ref) / nbytes,
        "payload_fraction_random_values": len(random_delta) / nbytes,
        "targets": {"encode_speedup_vs_reference": 2.0, "apply_speedup_vs_reference": 2.0,
                    "encode_vs_memcpy": 0.4, "payload_fraction": 0.015},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"buffer {nbytes / 2**30:.2f} GiB bf16, {unchanged:.4%} unchanged")
    print(f"memcpy                {results['memcpy_gbps']:7.2f} GB/s")
    print(f"encode                {results['encode_gbps']:7.2f} GB/s   reference "
          f"{results['reference_encode_gbps']:6.2f}   x{results['encode_speedup_vs_reference']:.2f}"
          f"   vs memcpy {results['encode_vs_memcpy']:.2f}")
    for label, key in (("apply into buffer", "into_buffer"), ("apply to new array", "new_array"),
                       ("apply in place", "in_place")):
        print(f"{label:21} {results[f'apply_{key}_gbps']:7.2f} GB/s   reference "
              f"{results[f'reference_apply_{key}_gbps']:6.2f}   "
              f"x{results[f'apply_speedup_vs_reference_{key}']:.2f}")
    print(f"payload               {results['payload_fraction']:.3%} of the bf16 bytes   reference "
          f"{results['reference_payload_fraction']:.3%}   random new values "
          f"{results['payload_fraction_random_values']:.3%}")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
