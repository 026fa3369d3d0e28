"""Solver + verifier: fully asynchronous AstraFlow vs the synchronous baseline.

Both modes run the same workload -- ``workflow=solve_verify`` with a long-tail
(log-normal) environment latency per turn -- with the same seeds, model, hardware and
step count, through the same data layer, nodes and trainers. Only the coupling
differs: ``mode=sync`` generates each iteration with the newest weights, waits for its
slowest rollout and for every trainer before the next; ``mode=async`` never waits.

An iteration is one training step of every policy: seconds per iteration is the wall
time from the first policy's first step to the last policy's final step, divided by
the steps in between.

``--accuracy`` then asks whether the verifier pays off: for each of ``--seeds`` it
trains the solver inside ``solve_verify`` and alone (``single_turn``), both from the
same warm-started model and with the same solver rollout budget (``--accuracy-steps``
steps of ``--accuracy-batch-size`` solver trajectories), without injected latency, and
compares the solver's held-out *first-answer* accuracy (the pair's final accuracy,
after a retry, is reported beside it). The gain counts only if it beats the
seed-to-seed spread.

Usage: python bench/multipolicy.py [--steps 40] [--batch-size 64] [--accuracy]
Writes bench/results/multipolicy.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, launch

RESULTS = Path(__file__).parent / "results" / "multipolicy.json"


def run(name: str, overrides: list[str], root: Path) -> dict:
    started = time.time()
    summary, records, per_step = launch(name, overrides, root)
    train = [r for r in records if r["kind"] == "train"]
    steps = max(r["step"] for r in train)
    waits = sum(r["wait_seconds"] for r in train)
    busy = sum(r["wait_seconds"] + r["step_seconds"] for r in train)
    out = {
        "seconds_per_iteration": per_step,
        "steps": steps,
        "trainer_wait_fraction": waits / busy if busy else 0.0,
        "wall_seconds": time.time() - started,
        "policies": summary["policies"],
    }
    print(f"{name:>12}: {out['seconds_per_iteration']:.2f} s/iteration, trainer wait "
          f"{out['trainer_wait_fraction']:.0%}, " + ", ".join(
              f"{p} acc {v['start_eval_accuracy']:.3f}->{v['final_eval_accuracy']:.3f}"
              for p, v in summary["policies"].items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--latency-median", type=float, default=0.3)
    parser.add_argument("--latency-sigma", type=float, default=1.2)
    parser.add_argument("--latency-max", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64, help="tasks in flight per node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accuracy", action="store_true",
                        help="also compare the solver with and without a verifier")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--accuracy-steps", type=int, default=150)
    parser.add_argument("--accuracy-batch-size", type=int, default=256)
    parser.add_argument("--skip-speed", action="store_true", help="only --accuracy")
    args = parser.parse_args()
    common = [f"steps={args.steps}", f"batch_size={args.batch_size}",
              f"group_size={args.group_size}", f"seed={args.seed}",
              f"eval_every={max(args.steps // 4, 1)}", f"node_concurrency={args.concurrency}"]
    latency = ["workflow.latency.kind=lognormal",
               f"workflow.latency.median={args.latency_median}",
               f"workflow.latency.sigma={args.latency_sigma}",
               f"workflow.latency.max={args.latency_max}"]
    results: dict = {"config": vars(args), "cpu": cpu_model()}
    print(f"CPU: {results['cpu']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="astraflow-multipolicy-") as tmp:
        root = Path(tmp)
        if not args.skip_speed:
            results["sync"] = run("sync", ["workflow=solve_verify", "mode=sync", *latency,
                                           *common], root)
            results["async"] = run("async", ["workflow=solve_verify", "mode=async",
                                             *latency, *common], root)
            speedup = (results["sync"]["seconds_per_iteration"]
                       / results["async"]["seconds_per_iteration"])
            results["speedup_async_over_sync"] = speedup
            print(f"async is {speedup:.2f}x faster per iteration than sync "
                  f"(paper: 212.64 s vs 77.65 s = 2.74x)", flush=True)
        if args.accuracy:
            results["accuracy"] = accuracy(args, root)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # a run of one part (--skip-speed) keeps the other part's last figures
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**previous, **results}, indent=2) + "\n")
    print(f"results: {RESULTS}")


def _final_eval(run_dir: Path, policy: str) -> dict:
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    evals = [r for r in evals if r["kind"] == "eval" and r["policy"] == policy]
    return {"start": evals[0], "final": evals[-1]}


def accuracy(args: argparse.Namespace, root: Path) -> dict:
    """The solver's held-out first-answer accuracy with and without a verifier, per seed."""
    out: dict = {"seeds": {}}
    common = [f"steps={args.accuracy_steps}", f"batch_size={args.accuracy_batch_size}",
              f"group_size={args.group_size}", f"eval_every={max(args.accuracy_steps // 3, 1)}"]
    for seed in args.seeds:
        pair_dir = root / f"pair-{seed}"
        run(f"pair-{seed}", ["workflow=solve_verify", f"seed={seed}", *common], root)
        model = _resolved_model(pair_dir)
        run(f"alone-{seed}", ["workflow=single_turn", f"seed={seed}", f"model.path={model}",
                              *common], root)
        pair = _final_eval(pair_dir, "solver")
        alone = _final_eval(root / f"alone-{seed}", "policy")
        row = {
            "start_first_answer": pair["start"]["eval_accuracy"],
            "pair_first_answer": pair["final"]["eval_accuracy"],
            "pair_final_answer": pair["final"].get("eval_final_answer"),
            "alone_first_answer": alone["final"]["eval_accuracy"],
            "verifier": _final_eval(pair_dir, "verifier")["final"]["eval_accuracy"],
        }
        row["gain"] = row["pair_first_answer"] - row["alone_first_answer"]
        out["seeds"][seed] = row
        print(f"seed {seed}: solver first answer {row['start_first_answer']:.3f} -> "
              f"{row['pair_first_answer']:.3f} with a verifier (pair final "
              f"{row['pair_final_answer']:.3f}, verifier {row['verifier']:.3f}), "
              f"{row['alone_first_answer']:.3f} alone: {row['gain'] * 100:+.1f} points",
              flush=True)
    gains = [r["gain"] for r in out["seeds"].values()]
    pairs = [r["pair_first_answer"] for r in out["seeds"].values()]
    alones = [r["alone_first_answer"] for r in out["seeds"].values()]
    out["mean_gain"] = sum(gains) / len(gains)
    out["spread"] = max(max(pairs) - min(pairs), max(alones) - min(alones))
    out["gain_beats_spread"] = out["mean_gain"] > out["spread"]
    print(f"first-answer gain with a verifier: {out['mean_gain'] * 100:+.1f} points "
          f"(per seed {', '.join(f'{g * 100:+.1f}' for g in gains)}); seed-to-seed spread "
          f"{out['spread'] * 100:.1f} points; paper: +5.4", flush=True)
    return out


def _resolved_model(run_dir: Path) -> str:
    """The model a run started from (the warm-started tiny model it built)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(run_dir / "config.yaml").model.path)

if __name__ == "__main__":
    main()
