"""Start-up: each component started fresh (``launcher.preload=false``, every process
imports torch and transformers itself) against components forked from the preloaded
parent (``launcher.preload=true``, the default), in one run of this script.

Three jobs, each run ``--repeat`` times per start, the two starts alternating:

* ``smoke`` -- ``+experiment=smoke`` (3 steps);
* ``default`` -- the default job, ended after 5 steps (start-up is the same as the
  600-step run's; the rest is training);
* ``two-policy`` -- ``workflow=solve_verify +experiment=smoke`` (a solver and a verifier,
  each with its trainer, evaluator and weight stream).

For each: seconds from the command to the first trajectory accepted and to the end of
the first train step (the latest policy's), the whole command's seconds, and the peak of
the run's processes' summed memory while it ran, both resident (RSS, which counts a
page shared by forked processes once per process) and proportional (PSS, which splits
it between them). Medians over the repeats; the preloaded start as a ratio of the fresh.

``--model DIR`` runs every job on that checkpoint instead (another architecture and
tokenizer: the gain must not be the tiny model's alone).

Usage: python bench/startup.py [--repeat 2] [--jobs smoke default two-policy] [--model DIR]
Writes bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _machine import cpu_model

RESULTS = Path(__file__).parent / "results" / "startup.json"
JOBS = {
    "smoke": ["+experiment=smoke"],
    "default": ["steps=5"],
    "two-policy": ["workflow=solve_verify", "+experiment=smoke"],
}
STARTS = {"fresh": "launcher.preload=false", "preloaded": "launcher.preload=true"}
METRICS = ("first_trajectory_s", "first_step_s", "wall_s", "peak_rss_mb", "peak_pss_mb")


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += parents.get(pid, [])
    return out


def memory_mb(pids: list[int]) -> tuple[float, float]:
    """Summed RSS and PSS of ``pids`` in MiB (from smaps_rollup)."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return rss / 1024, pss / 1024


class MemoryWatch(threading.Thread):
    """The peak of a process tree's summed memory, sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss = self.peak_pss = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            rss, pss = memory_mb(descendants(self.pid))
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)


def warm(overrides: list[str], root: Path) -> None:
    """Build the job's tiny model before anything is timed (a cache every run shares)."""
    from omegaconf import OmegaConf

    from astraflow.config import compose_config
    from astraflow.launch.prepare import prepare

    cfg = compose_config(overrides)
    cfg.run_dir = str(root / "warm")
    prepare(OmegaConf.create(OmegaConf.to_container(cfg)))


def measure(overrides: list[str], start: str, run_dir: Path) -> dict[str, float]:
    began = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow", *overrides, STARTS[start], f"run_dir={run_dir}",
         "launcher.progress=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watch = MemoryWatch(proc.pid)
    watch.start()
    _out, err = proc.communicate()
    wall = time.time() - began
    watch.done.set()
    watch.join()
    if proc.returncode != 0:
        raise SystemExit(f"{overrides} ({start}) failed:\n{err[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    started = summary["started_at"]
    policies = summary["policies"].values()
    return {
        "first_trajectory_s": min(started + p["first_trajectory_seconds"] for p in policies)
        - began,
        "first_step_s": max(started + p["first_step_seconds"] for p in policies) - began,
        "wall_s": wall,
        "peak_rss_mb": watch.peak_rss,
        "peak_pss_mb": watch.peak_pss,
        "per_policy_first_step_s": {name: round(started + p["first_step_seconds"] - began, 3)
                                    for name, p in summary["policies"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--model", default=None, help="a checkpoint directory to run on")
    args = parser.parse_args()
    model = [f"model.path={Path(args.model).resolve()}"] if args.model else []
    cpu = cpu_model()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for job in args.jobs:
            overrides = [*JOBS[job], *model]
            warm(overrides, root / job)
            runs: dict[str, list[dict]] = {start: [] for start in STARTS}
            for i in range(args.repeat):
                for start in STARTS:
                    runs[start].append(measure(overrides, start, root / job / f"{start}-{i}"))
                    print(f"{job} {start} #{i + 1}: "
                          + ", ".join(f"{m} {runs[start][-1][m]:.2f}" for m in METRICS),
                          flush=True)
            medians = {start: {m: round(statistics.median(r[m] for r in rs), 3)
                               for m in METRICS} for start, rs in runs.items()}
            results[job] = {
                **medians,
                "ratio": {m: round(medians["preloaded"][m] / medians["fresh"][m], 3)
                          for m in METRICS},
                "runs": runs,
            }
    print(f"\nStart-up, fresh vs preloaded (medians of {args.repeat}; CPU: {cpu}; model: "
          f"{args.model or 'the tiny model'})")
    print(f"{'job':11} {'metric':19} {'fresh':>9} {'preloaded':>10} {'ratio':>7}")
    for job, res in results.items():
        for m in METRICS:
            print(f"{job:11} {m:19} {res['fresh'][m]:9.2f} {res['preloaded'][m]:10.2f} "
                  f"{res['ratio'][m]:7.2f}")
    targets = {}
    if "smoke" in results:
        targets["smoke first step <= 0.5x"] = results["smoke"]["ratio"]["first_step_s"] <= 0.5
    if "two-policy" in results:
        targets["two-policy smoke <= 30 s"] = results["two-policy"]["preloaded"]["wall_s"] <= 30
    targets["memory (PSS) not higher"] = all(r["ratio"]["peak_pss_mb"] <= 1.0
                                             for r in results.values())
    for what, met in targets.items():
        print(f"  {'met' if met else 'MISSED'}: {what}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"cpu": cpu, "repeat": args.repeat, "model": args.model,
                                   "jobs": results,
                                   "targets": targets}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
