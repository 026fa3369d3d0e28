"""Delta codec benchmark: >= 1 GiB of bf16 weights with 99% of elements unchanged.

Everything is measured in the same run on the same buffers: our encode/apply, the
reference algorithm (compare as uint16, np.where, u32 indices + raw bf16 values behind
a 16-byte ``<QHHi`` header), and a plain memcpy of the buffer as the bandwidth limit.
Changed elements move by one unit in the last place, as bf16 RL updates do; the payload
of the same positions with random new values is reported too (the incompressible case).

Each round runs every contender once, so machine noise hits all of them alike; ratios
use the median over rounds. Times are this process's CPU time: every contender but
the two threaded applies is single-threaded, and on a shared machine wall time mostly
measures the neighbours (wall-clock figures are in the JSON too). The first round is a
warm-up (page faults, compiled kernels loaded); the cost of the very first encode in a
process is reported apart.

The two new-array applies get rounds of their own, after the others. Each faults in and
frees 1 GiB; interleaved, they made the encode after them up to a quarter slower in some
rounds and not others, while the memcpy beside it kept its speed. (The VM this was seen
on hands freed memory back to its host, free page reporting; that the host's remapping
is the cause is a guess.)

The apply target is judged on the in-place apply: that is what a node does (it patches the
tensors of the version it holds, ``apply_delta_file``). Into another buffer and into a
new array are reported beside it; the latter is mostly the kernel faulting in a fresh
1 GiB for either contender (and, with transparent huge pages, compacting memory for it).

Two more figures show where the apply stands on the machine at hand:

* ``touch_floor``: a bare compiled loop that adds each change's move to its lane from a
  ready-made u64 list of positions (asking L2 for the line a chunk of changes ahead, as
  the codec's patch does), no decoding at all: what the line misses alone cost one
  core when they overlap as far as the caches allow. The patch decodes in the shadow
  of those misses, so it should come close to this figure;
* ``apply_in_place_threads``: the in-place apply with its default threads (the CPUs this
  process may use), in *wall* time (its CPU time is the sum over threads), against the
  single-threaded reference and against ``reference_apply_in_place_threads``, the
  reference's scatter split between as many threads. Each core keeps its own misses
  in flight.

Usage: python bench/weights.py [--gib 1.0] [--rounds 7]; writes bench/results/weights.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from numba import njit

from astraflow.weights._kernels import CHUNK, _prefetch_l2
from astraflow.weights.codec import _threads, apply_delta, encode_delta

RESULTS = Path(__file__).parent / "results" / "weights.json"
TARGETS = {"encode_speedup_vs_reference": 2.0, "apply_speedup_vs_reference": 2.0,
           "encode_vs_memcpy": 0.4, "payload_fraction": 0.015}


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


def reference_changes(delta: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The positions and new values of a reference-format delta (views, no copy)."""
    count, _, flags, _ = struct.unpack_from("<QHHi", delta)
    width = 8 if flags & 1 else 4
    idx = np.frombuffer(delta, dtype=f"<u{width}", count=count, offset=16)
    values = np.frombuffer(delta, dtype="<u2", count=count, offset=16 + width * count)
    return idx, values


def reference_apply_threads(out: np.ndarray, delta: bytes, pool: ThreadPoolExecutor,
                            threads: int) -> None:
    """The reference applied in place by ``threads`` threads, each scattering its own run
    of changes (numpy lets go of the GIL while it scatters)."""
    idx, values = reference_changes(delta)
    bounds = [idx.size * part // threads for part in range(threads + 1)]

    def run(a: int, b: int) -> None:
        out[idx[a:b]] = values[a:b]

    for future in [pool.submit(run, a, b) for a, b in itertools.pairwise(bounds)]:
        future.result()


def reference_apply(old: np.ndarray, delta: bytes, out: np.ndarray | None) -> np.ndarray:
    idx, values = reference_changes(delta)
    if out is None:
        out = old.copy()
    elif out is not old:
        np.copyto(out, old)
    out[idx] = values
    return out


@njit(nogil=True)
def touch(dst: np.ndarray, positions: np.ndarray, moves: np.ndarray) -> None:
    """The floor of an in-place apply: each move added to its lane, nothing decoded."""
    for k in range(positions.size):
        if k + CHUNK < positions.size:
            _prefetch_l2(dst, positions[k + CHUNK])
        dst[positions[k]] += moves[k]


class Contender:
    """One timed operation; ``reset`` runs untimed before each call (in-place applies)."""

    def __init__(self, fn: Callable[[], object], reset: Callable[[], object] | None = None):
        self.fn, self.reset = fn, reset
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def run(self, record: bool) -> None:
        if self.reset is not None:
            self.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        self.fn()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if record:
            self.cpu.append(cpu)
            self.wall.append(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    small = np.arange(4096, dtype=np.uint16)
    start = time.perf_counter()
    apply_delta(small, encode_delta(small, small + 1))
    first_call = time.perf_counter() - start

    n = int(args.gib * (1 << 30)) // 2
    old, new = make_buffers(n, args.changed)
    nbytes = old.nbytes
    unchanged = 1 - np.count_nonzero(old != new) / n
    out = np.empty_like(old)
    delta, ref = encode_delta(old, new), reference_encode(old, new)
    for result in (apply_delta(old, delta), reference_apply(old, ref, None),
                   apply_delta(old, delta, out=out)):
        assert np.array_equal(result, new)
    del result
    np.copyto(out, old)
    assert np.array_equal(apply_delta(out, delta, out=out), new)

    def reset() -> None:
        np.copyto(out, old)

    positions = np.flatnonzero(old != new).astype(np.uint64)
    moves = new[positions] - old[positions]
    np.copyto(out, old)
    touch(out, positions, moves)
    assert np.array_equal(out, new)
    threads = _threads(None)
    pool = ThreadPoolExecutor(threads)
    reference_apply_threads(out, ref, pool, threads)
    assert np.array_equal(out, new)

    contenders = {  # one group of interleaved rounds each
        "memcpy": Contender(lambda: np.copyto(out, old)),
        "encode": Contender(lambda: encode_delta(old, new)),
        "reference_encode": Contender(lambda: reference_encode(old, new)),
        "apply_into_buffer": Contender(lambda: apply_delta(old, delta, out=out, threads=1)),
        "reference_apply_into_buffer": Contender(lambda: reference_apply(old, ref, out)),
        "apply_in_place": Contender(lambda: apply_delta(out, delta, out=out, threads=1),
                                    reset),
        "reference_apply_in_place": Contender(lambda: reference_apply(out, ref, out), reset),
        "touch_floor": Contender(lambda: touch(out, positions, moves), reset),
        "apply_in_place_threads": Contender(lambda: apply_delta(out, delta, out=out), reset),
        "reference_apply_in_place_threads": Contender(
            lambda: reference_apply_threads(out, ref, pool, threads), reset),
    }
    fresh_memory = {
        "apply_new_array": Contender(lambda: apply_delta(old, delta, threads=1)),
        "reference_apply_new_array": Contender(lambda: reference_apply(old, ref, None)),
    }
    for group in (contenders, fresh_memory):
        for round_ in range(args.rounds + 1):
            for contender in group.values():
                contender.run(record=round_ > 0)
    contenders.update(fresh_memory)

    random_new = old.copy()
    moved = np.flatnonzero(old != new)
    random_new[moved] = np.random.default_rng(1).integers(0, 1 << 16, moved.size,
                                                          dtype=np.uint16)
    random_new[moved] += (random_new[moved] == old[moved]).astype(np.uint16)
    random_delta = encode_delta(old, random_new)

    cpu = {name: statistics.median(c.cpu) for name, c in contenders.items()}
    wall = {name: statistics.median(c.wall) for name, c in contenders.items()}
    gbps = {name: nbytes / t / 1e9 for name, t in cpu.items()}
    results: dict[str, object] = {
        "buffer_bytes": nbytes, "dtype": "BF16", "unchanged_fraction": unchanged,
        "rounds": args.rounds, "clock": "process CPU time, median over interleaved rounds",
        "machine": platform.processor() or platform.machine(), "numpy": np.__version__,
        "first_call_seconds": first_call,
        **{f"{name}_gbps": value for name, value in gbps.items()},
        "encode_speedup_vs_reference": cpu["reference_encode"] / cpu["encode"],
        "encode_vs_memcpy": cpu["memcpy"] / cpu["encode"],
        **{f"apply_speedup_vs_reference_{kind}": cpu[f"reference_apply_{kind}"]
           / cpu[f"apply_{kind}"] for kind in ("into_buffer", "new_array", "in_place")},
        "apply_speedup_vs_reference": cpu["reference_apply_in_place"] / cpu["apply_in_place"],
        "touch_floor_speedup_vs_reference": cpu["reference_apply_in_place"]
        / cpu["touch_floor"],
        "apply_threads": threads,
        "apply_threads_speedup_vs_reference_wall": wall["reference_apply_in_place"]
        / wall["apply_in_place_threads"],
        "apply_threads_speedup_vs_reference_threads_wall":
        wall["reference_apply_in_place_threads"] / wall["apply_in_place_threads"],
        "payload_fraction": len(delta) / nbytes,
        "reference_payload_fraction": len(ref) / nbytes,
        "payload_fraction_random_values": len(random_delta) / nbytes,
        "seconds": {name: {"cpu": c.cpu, "wall": c.wall} for name, c in contenders.items()},
        "targets": TARGETS,
    }
    results["met"] = {
        "encode_speedup_vs_reference": results["encode_speedup_vs_reference"] >= 2.0,
        "encode_vs_memcpy": results["encode_vs_memcpy"] >= 0.4,
        "apply_speedup_vs_reference": results["apply_speedup_vs_reference"] >= 2.0,
        "payload_fraction": results["payload_fraction"] <= 0.015,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")

    def row(label: str, ours: str, reference: str, note: str = "") -> None:
        ratio = cpu[reference] / cpu[ours]
        print(f"{label:20} {gbps[ours]:6.2f} GB/s   reference {gbps[reference]:6.2f}   "
              f"x{ratio:.2f}{note}")

    print(f"buffer {nbytes / 2**30:.2f} GiB bf16, {unchanged:.4%} unchanged, median of "
          f"{args.rounds} interleaved rounds (CPU time); first encode+apply in a process "
          f"{first_call:.2f} s")
    print(f"memcpy               {gbps['memcpy']:6.2f} GB/s")
    row("encode", "encode", "reference_encode",
        f"   vs memcpy {results['encode_vs_memcpy']:.2f}")
    for kind in ("in_place", "into_buffer", "new_array"):
        row(f"apply {kind.replace('_', ' ')}", f"apply_{kind}", f"reference_apply_{kind}",
            "   (the target: nodes apply in place)" if kind == "in_place" else "")
    print(f"touch floor          {gbps['touch_floor']:6.2f} GB/s   reference x"
          f"{results['touch_floor_speedup_vs_reference']:.2f} (the misses alone, one thread)")
    print(f"apply in place, {threads} threads  x"
          f"{results['apply_threads_speedup_vs_reference_wall']:.2f} the 1-thread reference, "
          f"x{results['apply_threads_speedup_vs_reference_threads_wall']:.2f} the reference "
          f"on {threads} threads (wall time)")
    print(f"payload              {results['payload_fraction']:.3%} of the bf16 bytes   reference "
          f"{results['reference_payload_fraction']:.3%}   random new values "
          f"{results['payload_fraction_random_values']:.3%}")
    print("targets met: " + ", ".join(f"{k} {'yes' if v else 'NO'}"
                                      for k, v in results["met"].items()))
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
