"""Where a run's CPU goes, a step at a time: each component's CPU milliseconds per trainer
step, the machine's, and the trainer's wait, on a job and on a baseline job run the same
way.

The default pair is the latency job (each sample waits a log-normal environment call,
median 0.1 s, sigma 1.0: what ``peers.py --latency`` runs) against the same job without
latency. On two cores the trainer shares the CPU with generation, so its wait is set by
what a step costs the machine in all: this says which component to make cheaper.
``--engine sim`` runs both with the simulated engine (no model behind generation): the
schedule's own wait, with generation's CPU taken out.

Components' CPU is read from ``/proc`` (a process's own figure includes its threads that
ended); the measured window is from the trainer's 20th step to 20 steps before its last,
so start-up and the end are out of it.

Usage: python bench/cpu_split.py [--steps 300] [--engine hf|sim] [--runs 1] [-- OVERRIDES]
Writes bench/results/cpu_split.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import at_least_one, cpu_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "cpu_split.json"
LATENCY = ["workflow.latency.kind=lognormal", "workflow.latency.median=0.1",
           "workflow.latency.sigma=1.0"]
SIM = ["raas=sim", "raas.generation_seconds=0.005"]
MARGIN = 20  # steps left out at each end
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: str) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _machine() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def _components(run_dir: Path) -> dict[str, str]:
    """Role (``trainer``, ``node-0``, ...) -> pid of each component of the run."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # a component forked from the preloaded parent names itself in one argument
            raw = (entry / "cmdline").read_bytes().decode(errors="replace")
            words = raw.replace("\0", " ").split()
        except OSError:
            continue
        if "astraflow" in words and any(str(run_dir) in w for w in words) and not any(
                w.startswith("run_dir=") for w in words):
            role = words[words.index("astraflow") + 1]
            if "--name" in words:
                role = words[words.index("--name") + 1]
            out[role] = entry.name
    return out


def _steps(metrics: Path) -> int:
    return metrics.read_text().count("\n") if metrics.exists() else 0


def _wait(condition: Any, proc: subprocess.Popen, what: str) -> None:
    while not condition():
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before {what}; see its run directory")
        time.sleep(0.2)


def measure(steps: int, overrides: list[str], root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow", f"run_dir={run_dir}", "launcher.progress=false",
         "eval_deferred=true", f"steps={steps}", *overrides],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics" / "train-policy.jsonl"
    _wait(lambda: _steps(metrics) >= MARGIN, proc, f"step {MARGIN}")
    pids = _components(run_dir)
    start, first, busy0 = time.time(), _steps(metrics), _machine()
    cpu0 = {role: _cpu(pid) for role, pid in pids.items()}
    _wait(lambda: _steps(metrics) >= steps - MARGIN, proc, f"step {steps - MARGIN}")
    end, last, busy1 = time.time(), _steps(metrics), _machine()
    cpu1 = {role: _cpu(pid) for role, pid in pids.items()}
    proc.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    side = next(iter(summary["policies"].values())) if "policies" in summary else summary
    n = last - first
    return {
        "step_ms": 1000 * (end - start) / n,
        "machine_cores": (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1)
        * (os.cpu_count() or 1),
        "cpu_ms_per_step": {role: 1000 * (cpu1[role] - cpu0[role]) / n for role in pids},
        "trainer_wait_fraction": side.get("trainer_wait_fraction"),
        "trained_fraction": side.get("trained_fraction"),
        "samples_cancelled": side.get("samples_cancelled"),
    }


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=at_least_one, default=300)
    p.add_argument("--engine", choices=["hf", "sim"], default="hf")
    p.add_argument("--runs", type=at_least_one, default=1)
    p.add_argument("overrides", nargs="*", help="more overrides for both jobs")
    args = p.parse_args()
    if args.steps <= 3 * MARGIN:
        p.error(f"--steps must be over {3 * MARGIN}")
    engine = SIM if args.engine == "sim" else []
    root = REPO / "runs" / "cpu_split"
    root.mkdir(parents=True, exist_ok=True)
    cpu = cpu_model()
    print(f"CPU: {cpu}, {os.cpu_count()} cores; {args.steps} steps, engine {args.engine}",
          flush=True)
    jobs = {"latency": [*engine, *LATENCY, *args.overrides],
            "baseline (no latency)": [*engine, *args.overrides]}
    out: dict[str, Any] = {"cpu": cpu, "steps": args.steps, "engine": args.engine,
                           "overrides": args.overrides, "jobs": {}}
    for job, overrides in jobs.items():
        runs = [measure(args.steps, overrides, root) for _ in range(args.runs)]
        roles = sorted({role for r in runs for role in r["cpu_ms_per_step"]})
        split = {role: sum(r["cpu_ms_per_step"].get(role, 0.0) for r in runs) / len(runs)
                 for role in roles}
        out["jobs"][job] = {"runs": runs, "step_ms": _mean(runs, "step_ms"),
                            "machine_cores": _mean(runs, "machine_cores"),
                            "cpu_ms_per_step": split,
                            "trainer_wait_fraction": _mean(runs, "trainer_wait_fraction"),
                            "trained_fraction": _mean(runs, "trained_fraction")}
    base = out["jobs"]["baseline (no latency)"]
    print(f"{'':24s} {'step ms':>8s} {'cores':>6s} {'wait':>6s} {'trained':>8s}  "
          "CPU ms a step by component")
    for job, got in out["jobs"].items():
        split = ", ".join(f"{role} {ms:.1f}" for role, ms in
                          sorted(got["cpu_ms_per_step"].items(), key=lambda kv: -kv[1]))
        print(f"{job:24s} {got['step_ms']:8.1f} {got['machine_cores']:6.2f} "
              f"{got['trainer_wait_fraction']:6.1%} {got['trained_fraction']:8.3f}  {split}")
    lat = out["jobs"]["latency"]
    out["ratios"] = {
        "step": lat["step_ms"] / base["step_ms"],
        **{role: ms / base["cpu_ms_per_step"][role]
           for role, ms in lat["cpu_ms_per_step"].items()
           if base["cpu_ms_per_step"].get(role)},
    }
    print("latency / baseline: " + ", ".join(f"{k} {v:.2f}x" for k, v in out["ratios"].items()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
