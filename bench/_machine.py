"""What every benchmark quotes beside its figures: the CPU they were measured on; where
the launcher caches its models, which benchmarks share; and the check of their counts."""

from __future__ import annotations

import json
import platform
from pathlib import Path


def at_least_one(text: str) -> int:
    """An ``argparse`` type: a count of at least 1, refused by name otherwise."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cache_root() -> Path:
    """``$ASTRAFLOW_CACHE``, else ``~/.cache/astraflow``: the launcher's model cache."""
    import os

    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))


def machine() -> dict[str, object]:
    """The machine a result was measured on: CPU model, CPU count, Python."""
    import os

    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()}


def launch(name: str, overrides: list[str], root: Path) -> tuple[dict, list[dict], float]:
    """``python -m astraflow`` in ``root/name``: its summary, its metric records, and the
    seconds per step from the end of step 1 to the end of the last (start-up left out)."""
    import json
    import subprocess
    import sys

    run_dir = root / name
    proc = subprocess.run([sys.executable, "-m", "astraflow", f"run_dir={run_dir}",
                           "launcher.progress=false", *overrides],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    steps = max(r["step"] for r in train)
    first = min(r["time"] for r in train if r["step"] == 1)
    last = max(r["time"] for r in train if r["step"] == steps)
    return summary, records, (last - first) / max(steps - 1, 1)


def write_results(path: Path, payload: dict) -> None:
    """Write a benchmark's JSON result (``bench/results/<name>.json``) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"results: {path}")


def host_probe(reps: int = 7) -> float:
    """Median seconds of a fixed CPU workload on one torch thread: small layers'
    forwards and backwards, dispatch-bound as the tiny model's training is. A benchmark
    whose sides run one after the other takes it before and after each, so a host that
    changed speed between them (a noisy neighbour, a clock that moved) shows in the
    result instead of passing for one side's gain."""
    import statistics
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        layers = [torch.randn(256, 256, generator=gen, requires_grad=True) for _ in range(4)]
        x = torch.randn(64, 256, generator=gen)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            for _ in range(20):
                h = x
                for w in layers:
                    h = torch.tanh(h @ w)
                h.square().mean().backward()
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)
