"""AstraFlow's default job against TRL's GRPOTrainer: training time to held-out accuracy.

Both sides run one job: the same warm-started tiny model (the very checkpoint directory
AstraFlow's launcher builds and caches), the arithmetic task's train split in the same
order, prompts encoded to the same ids, the same exact-match reward, 32 prompts x 8
samples per optimizer step trained in micro-batches of 64 (``trainer.micro_batch_size``),
6 new tokens at temperature 1.0, AdamW at lr 3e-4 on a cosine schedule to 0.1x, PPO
clip 0.2/0.28, no KL, a token mean over the batch, the same seed; and the same held-out
evaluation (``eval_samples`` sampled answers per held-out task, every ``eval_every``
steps). Every setting is read from the AstraFlow
config the two sides share (``python -m astraflow`` with no overrides but the step
count and, for the latency job, the environment latency), so they cannot drift apart.

* AstraFlow: ``python -m astraflow`` (its default: asynchronous, HF rollout engine,
  trainer, evaluator and data layer as processes, one torch thread each);
* TRL: ``GRPOTrainer`` in one process (HF ``generate``, 2 torch threads), in a
  virtualenv of its own (TRL pins its own versions), made once under
  ``~/.cache/astraflow/venv-trl``.

Evaluation counts for neither side: TRL's stops its training and its time is kept out
of TRL's clock; AstraFlow's evaluator keeps a copy of each version due and scores them
once training is done (``eval_deferred``; ``--live-eval``: beside the trainer, sharing
the CPU, as a run does by default).

For each accuracy threshold the table gives the training seconds each side needs to
first reach it -- from the end of training step 1 to the end of the step whose weights
were evaluated (start-up and the first step are left out on both sides) -- and the
ratio TRL / AstraFlow; then the same from the command's start (start-up included).

``--latency``: the latency job instead -- each sample's reward waits a log-normal
environment call (``workflow.latency``, median ``--latency-median`` s, shape
``--latency-sigma``). AstraFlow waits for every sample on its own; TRL, a synchronous
trainer, calls its reward once per generation batch and waits for the slowest sample.

With ``--latency``, AstraFlow also runs the job without latency at the same settings:
its step time with latency over its step time without is what latency costs it.

``--checkpoint``: the plain job's shape on a checkpoint that is not the tiny model -- a
Llama with its own ChatML BPE tokenizer, the task's problems in JSONL files, the reward
in a Python file (``bench/_checkpoint.py`` builds and warm-starts it, cached per seed).

``--astraflow OVERRIDE...``: AstraFlow settings TRL has no counterpart for (how stale a
sample may be, how many tasks a node keeps in flight), the one allowed difference
between the two sides' configs; e.g. the latency job with
``--astraflow policies.policy.max_staleness=12 node_concurrency=256``.

``--seed 0 1 2`` (the plain job's default): one job per seed, then each threshold's
ratio across the seeds (the lowest, the median) and the final accuracies' mean
difference with its standard error. One run's held-out curve moves by about its
evaluation's standard error (0.018 at 100 tasks x 8 samples), which decides a threshold
both sides cross close together; so the plain job evaluates both sides every 25 steps
on 32 samples per task by default (``--eval-every``, ``--eval-samples``).

Usage: python bench/peers.py [--steps 600] [--latency | --checkpoint] [--skip-astraflow]
       [--skip-trl]
       [--astraflow OVERRIDE...] [--seed N [N ...]] [--eval-every N] [--eval-samples N]
       [--live-eval]
Writes bench/results/peers.json (a key per job: ``plain-seed0``..., the spread
``plain-seeds-0-1-2``, ``latency``, ``checkpoint-seed0``...); the runs stay in runs/peers/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _machine import at_least_one, cache_root, cpu_model, host_probe

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results" / "peers.json"
RUNS = REPO / "runs" / "peers"
CACHE = cache_root()
TRL_VENV = CACHE / "venv-trl"
#: what the TRL virtualenv holds: the CPU torch wheel the project pins, TRL (which pins
#: its own transformers and accelerate), and AstraFlow's torch-free core for its task,
#: reward and tokenizer
TRL_REQUIREMENTS = ("torch==2.13.0", "trl==1.16.0")
_IMPORT_CHECK = ("import torch, trl, transformers, datasets, astraflow.components, "
                 "astraflow.text; print(f'torch {torch.__version__}, trl {trl.__version__}, '"
                 "f'transformers {transformers.__version__}')")
THRESHOLDS = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)
#: the plain job by default: three seeds, evaluated every 25 steps on 32 samples per
#: held-out task (an evaluation's standard error ~0.009, against 0.018 at the run's 8)
PLAIN_SEEDS = (0, 1, 2)
PLAIN_EVAL_EVERY = 25
PLAIN_EVAL_SAMPLES = 32


def trl_python() -> Path:
    """The TRL virtualenv's interpreter, the virtualenv made first if it is not there."""
    python = TRL_VENV / "bin" / "python"
    stamp = TRL_VENV / ".installed"
    wanted = json.dumps({"requirements": TRL_REQUIREMENTS, "repo": str(REPO)})
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"peers: making the TRL virtualenv in {TRL_VENV} (once; a few minutes)", flush=True)
    base = shutil.which("python3") or sys.executable
    steps = [
        ("creating the virtualenv", [base, "-m", "venv", str(TRL_VENV)]),
        ("upgrading pip", [str(python), "-m", "pip", "install", "--upgrade", "pip"]),
        # torch first, pinned to the local CPU wheel: an unpinned one pulls a CUDA build
        (f"installing {TRL_REQUIREMENTS[0]}",
         [str(python), "-m", "pip", "install", TRL_REQUIREMENTS[0]]),
        (f"installing {TRL_REQUIREMENTS[1]}",
         [str(python), "-m", "pip", "install", *TRL_REQUIREMENTS]),
        # the core alone (no extras): torch-free, it brings the task, reward and tokenizer
        (f"installing astraflow's core from {REPO}",
         [str(python), "-m", "pip", "install", "-e", str(REPO)]),
    ]
    for n, (what, cmd) in enumerate(steps, 1):
        print(f"peers: [{n}/{len(steps) + 1}] {what}", flush=True)
        subprocess.run(cmd, check=True)
    print(f"peers: [{len(steps) + 1}/{len(steps) + 1}] checking the imports", flush=True)
    check = subprocess.run([str(python), "-c", _IMPORT_CHECK], capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"the TRL virtualenv {TRL_VENV} cannot import what the benchmark "
                         f"needs:\n{check.stderr[-3000:]}")
    print(f"peers: TRL virtualenv ready: {check.stdout.strip()}", flush=True)
    stamp.write_text(wanted)
    return python


def shared_config(overrides: list[str], run_dir: Path) -> Any:
    """The AstraFlow run config for ``overrides``, resolved by the launcher's own
    ``prepare`` (which builds or reuses the cached warm-started model) and written to
    ``run_dir/config.yaml``: what the TRL side reads."""
    from astraflow.config import compose_config
    from astraflow.launch.prepare import prepare

    cfg, _ = prepare(compose_config([f"run_dir={run_dir}", *overrides]))
    return cfg


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def run_astraflow(overrides: list[str], run_dir: Path, shared: Any,
                  own: tuple[str, ...] = ()) -> dict[str, Any]:
    """``own``: AstraFlow-only settings (``--astraflow``), the one allowed difference
    between the config it resolves and the one TRL is given."""
    from omegaconf import OmegaConf

    log = run_dir.parent / f"{run_dir.name}.log"
    print(f"astraflow: running (log {log})", flush=True)
    started = time.time()
    with log.open("w") as fh:
        proc = subprocess.run([sys.executable, "-m", "astraflow", f"run_dir={run_dir}",
                               *overrides, *own],
                              stdout=fh, stderr=subprocess.STDOUT)
    wall = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"astraflow failed ({proc.returncode}):\n{_tail(log)}")
    mine = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    theirs = OmegaConf.to_container(shared)
    mine.pop("run_dir")
    theirs.pop("run_dir")
    allowed = {o.split("=", 1)[0].lstrip("+") + "." for o in own}
    differ = sorted(k for k in set(_flat(mine)) | set(_flat(theirs))
                    if _flat(mine).get(k) != _flat(theirs).get(k) and k not in allowed)
    if differ:
        raise SystemExit("the AstraFlow run resolved another config than the one TRL is "
                         f"given: {', '.join(differ)}")
    policy = next(iter(shared.policies))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train" and r["policy"] == policy]
    evals = sorted((r for r in records if r["kind"] == "eval" and r["policy"] == policy),
                   key=lambda r: r["version"])
    # the end of the step that made each version (the eval record names the version)
    ended = {r["version"]: r["time"] for r in train}
    first = min(r["time"] for r in train if r["step"] == 1)
    points = [_point(r["version"], r["eval_accuracy"], ended.get(r["version"]), first, started)
              for r in evals if r["version"] == 0 or r["version"] in ended]
    last = max(train, key=lambda r: r["step"])
    out = _summary(points, wall, first - started, (last["time"] - first) / max(last["step"] - 1, 1),
                   last["step"])
    out["run_dir"] = str(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    out["trainer_wait_fraction"] = summary["policies"][policy]["trainer_wait_fraction"]
    out["trained_fraction"] = summary["policies"][policy]["trained_fraction"]
    # over-provisioned groups: samples started and cancelled (not generated
    # trajectories; in the single-turn job each is one abandoned environment call)
    out["samples_cancelled"] = summary["policies"][policy].get("samples_cancelled", 0)
    out["samples_started"] = summary["policies"][policy]["trajectories_generated"] + (
        out["samples_cancelled"])
    # how off-policy the trained batches were, and what cutting the tail kept
    out["ess_fraction_mean"] = _mean(r.get("train/ess_fraction") for r in train)
    out["offpolicy_kl_mean"] = _mean(r.get("train/offpolicy_kl") for r in train)
    out["staleness_max"] = max(r["staleness_max"] for r in train)
    out["audit_kept_reward"] = _mean(r.get("overprovision/kept_reward") for r in train)
    out["audit_cancelled_reward"] = _mean(r.get("overprovision/cancelled_reward")
                                          for r in train)
    return out


def _mean(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for key, sub in node.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}


def run_trl(python: Path, config: Path, run_dir: Path, threads: int) -> dict[str, Any]:
    out_json = run_dir / "trl.json"
    log = run_dir / "trl.log"
    print(f"trl: running (log {log})", flush=True)
    started = time.time()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    with log.open("w") as fh:
        # progress lines on stdout, everything else (warnings) in the log
        proc = subprocess.run([str(python), str(BENCH / "_trl_grpo.py"), str(config),
                               str(out_json), "--threads", str(threads)],
                              stderr=fh, env=env, cwd=run_dir)
    wall = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"trl failed ({proc.returncode}):\n{_tail(log)}")
    data = json.loads(out_json.read_text())
    # the training clock: each step's end minus the evaluations before it
    ended = {s["step"]: s["time"] - s["eval_seconds"] for s in data["steps"]}
    first = ended[1]
    points = [_point(e["step"], e["eval_accuracy"], ended.get(e["step"]), first, started)
              for e in data["evals"] if e["step"] == 0 or e["step"] in ended]
    last = max(ended)
    out = _summary(points, wall, first - started, (ended[last] - first) / max(last - 1, 1), last)
    out.update(run_dir=str(run_dir), eval_seconds=data["eval_seconds"],
               latency_seconds=data["latency_seconds"], grpo_config=data["grpo_config"],
               versions=data["versions"], threads=data["threads"])
    return out


def _point(step: int, accuracy: float, ended: float | None, first: float,
           started: float) -> dict[str, Any]:
    """An evaluation of the weights after ``step``; step 0 is the start (no time)."""
    if step == 0 or ended is None:
        return {"step": step, "eval_accuracy": accuracy, "from_first_step": None,
                "from_start": None}
    return {"step": step, "eval_accuracy": accuracy, "from_first_step": ended - first,
            "from_start": ended - started}


def _summary(points: list[dict[str, Any]], wall: float, first_step: float,
             per_step: float, steps: int) -> dict[str, Any]:
    return {"points": points, "wall_seconds": wall, "first_step_seconds": first_step,
            "seconds_per_step": per_step, "steps": steps,
            "start_eval_accuracy": points[0]["eval_accuracy"] if points else None,
            "final_eval_accuracy": points[-1]["eval_accuracy"] if points else None}


def time_to(points: list[dict[str, Any]], threshold: float, key: str) -> float | None:
    """Seconds (``key``) at which held-out accuracy first reaches ``threshold``: 0 if the
    start does, None if never."""
    for p in points:
        if p["eval_accuracy"] >= threshold - 1e-9:
            return 0.0 if p["step"] == 0 else p[key]
    return None


def compare(sides: dict[str, dict[str, Any]], thresholds: list[float]) -> list[dict[str, Any]]:
    rows = []
    for th in thresholds:
        row: dict[str, Any] = {"threshold": th}
        for key in ("from_first_step", "from_start"):
            a = time_to(sides["astraflow"]["points"], th, key) if "astraflow" in sides else None
            t = time_to(sides["trl"]["points"], th, key) if "trl" in sides else None
            row[f"astraflow_{key}"], row[f"trl_{key}"] = a, t
            # a threshold the start already meets (0 s) compares nothing
            row[f"ratio_{key}"] = t / a if a and t else None
        rows.append(row)
    return rows


def _s(value: float | None) -> str:
    return "    --" if value is None else " start" if value == 0 else f"{value:6.1f}"


def _x(value: float | None) -> str:
    return "   --" if value is None else f"{value:5.2f}x"


def report(job: str, sides: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    print(f"\n{job} job -- held-out eval_accuracy, start -> final:")
    for name, side in sides.items():
        print(f"  {name:>9}: {side['start_eval_accuracy']:.3f} -> {side['final_eval_accuracy']:.3f}"
              f" in {side['steps']} steps, {side['seconds_per_step']:.2f} s/step, first step "
              f"{side['first_step_seconds']:.1f} s after start, wall {side['wall_seconds']:.0f} s"
              + (f", trainer wait {side['trainer_wait_fraction']:.1%}, trained / generated "
                 f"{side['trained_fraction']:.3f}" if "trained_fraction" in side else "")
              + (f", {side['samples_cancelled']} samples cancelled of "
                 f"{side['samples_started']} started (in the latency job, an environment "
                 f"call each), ESS/batch "
                 f"{side['ess_fraction_mean']:.3f}, KL {side['offpolicy_kl_mean']:.4f}, "
                 f"staleness max {side['staleness_max']}"
                 if side.get("ess_fraction_mean") is not None else "")
              + (f", audited reward kept {side['audit_kept_reward']:.3f} vs cancelled "
                 f"{side['audit_cancelled_reward']:.3f}"
                 if side.get("audit_cancelled_reward") is not None else ""))
    probes = probe_line(sides)
    if probes:
        print(probes)
    print("  seconds to first reach the accuracy (never: --; start: before step 1)")
    print("            from the end of step 1          from the command's start")
    print("  accuracy  AstraFlow    TRL  TRL/AstraFlow  AstraFlow    TRL  TRL/AstraFlow")
    for r in rows:
        print(f"  {r['threshold']:8.2f}  {_s(r['astraflow_from_first_step'])}    "
              f"{_s(r['trl_from_first_step'])}  {_x(r['ratio_from_first_step'])}       "
              f"{_s(r['astraflow_from_start'])}    {_s(r['trl_from_start'])}  "
              f"{_x(r['ratio_from_start'])}")


def probed(run: Any) -> dict[str, Any]:
    """``run()``'s side, with the host's speed (:func:`host_probe`, ms) just before and
    just after it: the two sides run one after the other, and a host that slowed down
    or sped up between them moves the ratios as much as either side's code does."""
    before = host_probe() * 1000
    side = run()
    side["host_probe_ms"] = [before, host_probe() * 1000]
    return side


def probe_ms(side: dict[str, Any] | None) -> float | None:
    """The host probe around a side's run (before and after, averaged), if it was taken."""
    probes = (side or {}).get("host_probe_ms")
    return sum(probes) / len(probes) if probes else None


def probe_line(sides: dict[str, dict[str, Any]]) -> str | None:
    """How fast the host was during each side's run, and TRL's against AstraFlow's."""
    probes = {name: ms for name, s in sides.items() if (ms := probe_ms(s)) is not None}
    if not probes:
        return None
    line = "  host probe (one thread, lower is faster): " + ", ".join(
        f"{name} {ms:.1f} ms" for name, ms in probes.items())
    if "astraflow" in probes and "trl" in probes:
        line += (f"; the host was {probes['trl'] / probes['astraflow']:.2f}x as slow in "
                 "TRL's run as in AstraFlow's")
    return line


def job_kind(args: argparse.Namespace) -> str:
    """Which job the command runs: ``latency``, ``checkpoint`` or ``plain``."""
    return "latency" if args.latency else "checkpoint" if args.checkpoint else "plain"


def run_job(args: argparse.Namespace, seed: int | None) -> tuple[str, dict[str, Any]]:
    """One job (one seed): each side's run, the comparison; stored under the job's key."""
    job = job_kind(args)
    if seed is not None:
        job += f"-seed{seed}"
    # launcher.progress=false: the run's log gets no progress bar (both sides' config)
    overrides = ["launcher.progress=false", f"steps={args.steps}"]
    if args.eval_every is not None:
        overrides.append(f"eval_every={args.eval_every}")
    if args.eval_samples is not None:
        overrides.append(f"eval_samples={args.eval_samples}")
    if seed is not None:
        overrides.append(f"seed={seed}")
    if args.checkpoint:
        from _checkpoint import make_checkpoint_job

        overrides += make_checkpoint_job(CACHE, seed or 0)
    if args.latency:
        overrides += ["workflow.latency.kind=lognormal",
                      f"workflow.latency.median={args.latency_median}",
                      f"workflow.latency.sigma={args.latency_sigma}"]
    # TRL's evaluation stops its training and is taken off its clock; AstraFlow's
    # evaluator scores kept versions once training is done, off its clock too
    own = ([] if args.live_eval else ["eval_deferred=true"]) + list(args.astraflow)
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    previous = results.get(job, {})
    if previous.get("config", {}).get("overrides") != overrides:
        previous = {}  # another job: its figures do not compare with this one's
    cpu = cpu_model()
    print(f"CPU: {cpu}\njob: {job} ({' '.join(overrides[1:])})", flush=True)
    root = RUNS / f"{time.strftime('%Y%m%d-%H%M%S')}-{job}"
    root.mkdir(parents=True, exist_ok=True)
    python = None if args.skip_trl else trl_python()
    shared = shared_config(overrides, root / "trl")
    print(f"model: {shared.model.path}", flush=True)
    sides: dict[str, dict[str, Any]] = {}
    if args.skip_astraflow:
        if "astraflow" in previous:
            sides["astraflow"] = previous["astraflow"]
        if "astraflow_no_latency" in previous:
            sides["astraflow_no_latency"] = previous["astraflow_no_latency"]
    else:
        sides["astraflow"] = probed(lambda: run_astraflow(overrides, root / "astraflow",
                                                          shared, tuple(own)))
        if args.latency:
            # the baseline of latency's cost: the same AstraFlow settings, no latency
            plain = [o for o in overrides if not o.startswith("workflow.latency.")]
            sides["astraflow_no_latency"] = probed(lambda: run_astraflow(
                plain, root / "astraflow-no-latency",
                shared_config(plain, root / "no-latency"), tuple(own)))
    if args.skip_trl:
        if "trl" in previous:
            sides["trl"] = previous["trl"]
    else:
        assert python is not None
        sides["trl"] = probed(lambda: run_trl(python, root / "trl" / "config.yaml",
                                              root / "trl", args.threads))
    rows = compare(sides, args.thresholds)
    report(job, sides, rows)
    cost = None
    if "astraflow_no_latency" in sides and "astraflow" in sides:
        cost = (sides["astraflow"]["seconds_per_step"]
                / sides["astraflow_no_latency"]["seconds_per_step"])
        print(f"  AstraFlow's step with latency / without (same settings): {cost:.2f}x")
    return job, {"config": {"overrides": overrides, "threads": args.threads,
                            "astraflow_overrides": own, "model": str(shared.model.path)},
                 "cpu": cpu, **sides, "thresholds": rows, "latency_step_ratio": cost}


def spread(jobs: dict[str, dict[str, Any]], thresholds: list[float]) -> dict[str, Any]:
    """Several seeds of one job side by side: per threshold each seed's ratio (from the
    end of step 1), the lowest and the median; each seed's final accuracies and the mean
    difference with its standard error."""
    import statistics

    rows = []
    for i, th in enumerate(thresholds):
        ratios = [j["thresholds"][i]["ratio_from_first_step"] for j in jobs.values()]
        known = [r for r in ratios if r is not None]
        rows.append({"threshold": th, "ratios": ratios,
                     "lowest": min(known) if known else None,
                     "median": statistics.median(known) if known else None})
    finals = {name: {side: j[side]["final_eval_accuracy"] for side in ("astraflow", "trl")
                     if side in j} for name, j in jobs.items()}
    diffs = [f["astraflow"] - f["trl"] for f in finals.values() if len(f) == 2]
    mean = statistics.fmean(diffs) if diffs else None
    error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    probe = {}
    for name, j in jobs.items():
        trl, ours = probe_ms(j.get("trl")), probe_ms(j.get("astraflow"))
        probe[name] = trl / ours if trl is not None and ours is not None else None
    return {"jobs": list(jobs), "thresholds": rows, "final": finals,
            "final_difference_mean": mean, "final_difference_stderr": error,
            "host_probe_trl_over_astraflow": probe}


def report_spread(result: dict[str, Any]) -> None:
    names = result["jobs"]
    print(f"\n{len(names)} seeds ({', '.join(names)}) -- TRL / AstraFlow, from the end of "
          "step 1 (--: not reached by both):")
    print("  accuracy  " + "  ".join(f"{n.rsplit('-', 1)[-1]:>7}" for n in names)
          + "   lowest  median")
    for r in result["thresholds"]:
        print(f"  {r['threshold']:8.2f}  " + "  ".join(f"{_x(x):>7}" for x in r["ratios"])
              + f"   {_x(r['lowest'])}  {_x(r['median'])}")
    print("  final eval_accuracy, AstraFlow vs TRL: " + ", ".join(
        f"{n.rsplit('-', 1)[-1]} {f.get('astraflow', float('nan')):.3f} vs "
        f"{f.get('trl', float('nan')):.3f}" for n, f in result["final"].items()))
    if result["final_difference_mean"] is not None:
        stderr = result["final_difference_stderr"]
        print(f"  mean difference {result['final_difference_mean']:+.3f}"
              + (f" (standard error {stderr:.3f})" if stderr is not None else ""))
    probe = result.get("host_probe_trl_over_astraflow") or {}
    if any(v is not None for v in probe.values()):
        print("  host probe, TRL's run / AstraFlow's (1.00: the host held its speed): "
              + ", ".join(f"{n.rsplit('-', 1)[-1]} {_x(v)}" for n, v in probe.items()))


def main() -> None:
    from astraflow.config import AstraFlowConfig

    defaults = AstraFlowConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=at_least_one, default=defaults.steps)
    parser.add_argument("--eval-every", type=at_least_one, default=None,
                        help=f"held-out evaluation every N steps (default {PLAIN_EVAL_EVERY} "
                             f"for the plain job, the run's {defaults.eval_every} for --latency)")
    parser.add_argument("--eval-samples", type=at_least_one, default=None,
                        help="sampled answers per held-out task in each evaluation (default "
                             f"{PLAIN_EVAL_SAMPLES} for the plain job, the run's "
                             f"{defaults.eval_samples} for --latency); more: a less noisy curve")
    parser.add_argument("--live-eval", action="store_true",
                        help="AstraFlow's evaluator scores while training runs, sharing the "
                             "CPU (its default) instead of after training (eval_deferred)")
    parser.add_argument("--latency", action="store_true",
                        help="the latency job (log-normal environment latency per sample)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="the plain job on a Llama checkpoint with its own tokenizer, "
                             "JSONL files and a reward file (bench/_checkpoint.py)")
    parser.add_argument("--latency-median", type=float, default=0.1)
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--threads", type=at_least_one, default=2, help="TRL's torch threads")
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    parser.add_argument("--skip-astraflow", action="store_true",
                        help="keep AstraFlow's last figures for this job (same steps)")
    parser.add_argument("--skip-trl", action="store_true",
                        help="keep TRL's last figures for this job (same steps)")
    parser.add_argument("--seed", type=int, nargs="+", default=None, dest="seeds",
                        help="both sides' seed (the warm-started model, the sampling); "
                             "each seed's results are kept apart (plain-seed1, ...); several: "
                             "one job per seed, then the spread across them (default "
                             f"{' '.join(map(str, PLAIN_SEEDS))} for the plain job, the run's "
                             "for --latency)")
    parser.add_argument("--astraflow", nargs="+", default=[], metavar="OVERRIDE",
                        help="AstraFlow settings TRL has no counterpart for, e.g. "
                             "policies.policy.max_staleness=8 node_concurrency=256")
    args = parser.parse_args()
    if args.latency and args.checkpoint:
        parser.error("--latency and --checkpoint are two jobs: give one")
    if not args.latency:  # the plain job's answer, from curves finer than one run's
        args.seeds = args.seeds or list(PLAIN_SEEDS)
        args.eval_every = args.eval_every or PLAIN_EVAL_EVERY
        args.eval_samples = args.eval_samples or PLAIN_EVAL_SAMPLES
    jobs = {}
    for seed in args.seeds or [None]:
        job, result = run_job(args, seed)
        jobs[job] = result
        # each job is written as it ends: a long call interrupted keeps what it measured
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        results[job] = result
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    if len(jobs) > 1:
        result = spread(jobs, args.thresholds)
        report_spread(result)
        results = json.loads(RESULTS.read_text())
        results["-".join([job_kind(args), "seeds", *map(str, args.seeds)])] = {
            "cpu": cpu_model(), **result}
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
