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
steps of ``--accuracy-batch-size`` solver trajectories), without injected latency, on
``--task`` (``subset_sum`` by default: checking an answer is easier than finding one;
``arithmetic``: checking ``a+b=c`` is computing ``c``). It compares held-out accuracy:
the pair's *final answer* (after the verifier's verdict and a retry) and the solver's
own *first answer* against the solver trained alone, and reports why -- the verifier's
balanced accuracy at every evaluation, and what the retries did (answers fixed and
broken per task). The gain counts only if it beats the seed-to-seed spread.

Usage: python bench/multipolicy.py [--steps 40] [--batch-size 64] [--accuracy]
[--pair workflow.retries=3]
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
    parser.add_argument("--task", default="subset_sum", choices=("subset_sum", "arithmetic"),
                        help="the --accuracy task (its own reward)")
    parser.add_argument("--pair", nargs="+", default=[], metavar="OVERRIDE",
                        help="--accuracy: settings of the pair's run alone, e.g. "
                             "workflow.retries=3 (results kept under their own key)")
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
            key = "accuracy" + "".join(f" {o}" for o in args.pair)
            results[key] = accuracy(args, root)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # a run of one part (--skip-speed) keeps the other part's last figures
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**previous, **results}, indent=2) + "\n")
    print(f"results: {RESULTS}")


def _evals(run_dir: Path, policy: str) -> list[dict]:
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r for r in evals if r["kind"] == "eval" and r["policy"] == policy]


def _balanced(verdicts: dict, prefix: str = "eval") -> float | None:
    """The verifier's balanced accuracy: the mean of its accuracy on right answers and
    on wrong ones (an evaluation with no answer of one kind has none)."""
    right, wrong = verdicts.get(f"{prefix}_accept_right"), verdicts.get(f"{prefix}_reject_wrong")
    return None if right is None or wrong is None else (right + wrong) / 2


def accuracy(args: argparse.Namespace, root: Path) -> dict:
    """Held-out accuracy with and without a verifier, per seed, and why."""
    out: dict = {"task": args.task, "pair_overrides": list(args.pair), "seeds": {}}
    reward = "subset_sum" if args.task == "subset_sum" else "exact_match"
    common = [f"task={args.task}", f"reward={reward}", f"steps={args.accuracy_steps}",
              f"batch_size={args.accuracy_batch_size}", f"group_size={args.group_size}",
              f"eval_every={max(args.accuracy_steps // 3, 1)}"]
    for seed in args.seeds:
        pair_dir = root / f"pair-{seed}"
        run(f"pair-{seed}", ["workflow=solve_verify", f"seed={seed}", *common, *args.pair],
            root)
        model = _resolved_model(pair_dir)
        run(f"alone-{seed}", ["workflow=single_turn", f"seed={seed}", f"model.path={model}",
                              *common], root)
        solver, verifier = _evals(pair_dir, "solver"), _evals(pair_dir, "verifier")
        alone = _evals(root / f"alone-{seed}", "policy")
        final = solver[-1]
        row = {
            "start_first_answer": solver[0]["eval_accuracy"],
            "start_final_answer": solver[0].get("eval_final_answer"),
            "pair_first_answer": final["eval_accuracy"],
            "pair_final_answer": final.get("eval_final_answer"),
            "alone_first_answer": alone[-1]["eval_accuracy"],
            "greedy": {"pair_final_answer": final.get("eval_greedy_final_answer"),
                       "pair_first_answer": final.get("eval_greedy_accuracy"),
                       "alone": alone[-1].get("eval_greedy_accuracy")},
            # per evaluation: the verifier's balanced accuracy and what retries did
            "over_time": [{"version": s["version"],
                           "first_answer": s["eval_accuracy"],
                           "final_answer": s.get("eval_final_answer"),
                           "retried": s.get("eval_retried"), "fixed": s.get("eval_fixed"),
                           "broke": s.get("eval_broke"),
                           "verifier_balanced": _balanced(v)}
                          for s, v in zip(solver, verifier, strict=False)],
            "alone_over_time": [{"version": a["version"], "accuracy": a["eval_accuracy"]}
                                for a in alone],
        }
        row["verifier_balanced"] = row["over_time"][-1]["verifier_balanced"]
        row["fixed"], row["broke"] = final.get("eval_fixed"), final.get("eval_broke")
        row["gain"] = row["pair_final_answer"] - row["alone_first_answer"]
        row["first_answer_gain"] = row["pair_first_answer"] - row["alone_first_answer"]
        out["seeds"][seed] = row
        print(f"seed {seed}: pair's final answer {row['pair_final_answer']:.3f} (solver's "
              f"first {row['start_first_answer']:.3f} -> {row['pair_first_answer']:.3f}), "
              f"solver alone {row['alone_first_answer']:.3f}: {row['gain'] * 100:+.1f} points "
              f"(first answer {row['first_answer_gain'] * 100:+.1f}); verifier balanced "
              f"{row['verifier_balanced']:.3f}; retries fixed {row['fixed']:.3f} and broke "
              f"{row['broke']:.3f} of the tasks", flush=True)
    rows = list(out["seeds"].values())
    gains = [r["gain"] for r in rows]
    out["mean_gain"] = sum(gains) / len(gains)
    out["mean_first_answer_gain"] = sum(r["first_answer_gain"] for r in rows) / len(rows)
    finals = [r["pair_final_answer"] for r in rows]
    alones = [r["alone_first_answer"] for r in rows]
    out["spread"] = max(max(finals) - min(finals), max(alones) - min(alones))
    out["gain_beats_spread"] = out["mean_gain"] > out["spread"]
    out["target_met"] = out["mean_gain"] >= 0.03
    print(f"final-answer gain with a verifier: {out['mean_gain'] * 100:+.1f} points "
          f"(per seed {', '.join(f'{g * 100:+.1f}' for g in gains)}; first answer "
          f"{out['mean_first_answer_gain'] * 100:+.1f}); seed-to-seed spread "
          f"{out['spread'] * 100:.1f} points; target +3.0, paper +5.4", flush=True)
    return out


def _resolved_model(run_dir: Path) -> str:
    """The model a run started from (the warm-started tiny model it built)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(run_dir / "config.yaml").model.path)

if __name__ == "__main__":
    main()
