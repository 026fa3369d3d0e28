"""Partial rollouts: how soon new weights serve, with and without, on long-tail lengths.

The workload is the default job with room for long generations: ``max_new_tokens`` of
``--max-new-tokens`` (default 96) instead of 6, sampled at ``--temperature``. Most
answers end after a few tokens, but a sampled sequence that misses its end token runs
to the limit, and an engine's batch lasts as long as its longest sequence: the lengths
have a long tail. Without partial rollouts a node loads new weights only once the
generations in flight have finished; with ``partial_rollouts=true`` it swaps them in
under those generations, which go on with them from their next token.

Both runs use the same seed, steps and engine (``--raas``, default hf); the figures are
read from each run's own records:

* refresh delay -- seconds from a version's publication to a node serving it (mean,
  90th percentile), from ``metrics/refresh-<node>.jsonl``;
* load seconds -- how long each load held the refresh (with the engine paused, that
  includes waiting for the generations in flight);
* trainer wait fraction, seconds per step, trained / generated;
* the ledger -- every generated trajectory trained, dropped or still buffered, per pool.

``--raas sim raas.token_seconds=0.004`` replays the same on the simulated engine, whose
lengths are geometric (a uniform token stream that stops at the end token) and whose
seconds per token are what a GPU engine would take, without the CPU's own contention.

Usage: python bench/partial_rollouts.py [--steps 60] [--raas hf] [OVERRIDE ...]
Writes bench/results/partial_rollouts.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, launch

RESULTS = Path(__file__).parent / "results" / "partial_rollouts.json"


def ledger_holds(summary: dict) -> bool:
    """generated = trained + dropped + pending in every pool of every policy."""
    for policy in summary["policies"].values():
        for pool in policy["by_pool"].values():
            dropped = sum(v for k, v in pool.items() if k.startswith("dropped"))
            if pool["generated"] != pool["trained"] + dropped + pool["pending"]:
                return False
    return True


def run(name: str, overrides: list[str], root: Path) -> dict:
    started = time.time()
    summary, records, per_step = launch(name, overrides, root)
    steps = max(r["step"] for r in records if r["kind"] == "train")
    policy = summary["policies"]["policy"]
    refresh = policy["refresh"]
    loads = [r for r in records if r["kind"] == "refresh" and r["version"] > 0]
    out = {
        "seconds_per_step": per_step,
        "steps": steps,
        "trainer_wait_fraction": policy["trainer_wait_fraction"],
        "trained_fraction": policy["trained_fraction"],
        "generated": policy["trajectories_generated"],
        "trained": policy["trajectories_trained"],
        "left_over": policy["trajectories_left_over"],
        "by_pool": policy["by_pool"],
        "ledger_holds": ledger_holds(summary),
        "refresh": refresh,
        "versions_loaded": len(loads),
        "final_eval_accuracy": policy["final_eval_accuracy"],
        "wall_seconds": time.time() - started,
    }
    print(f"{name:>8}: refresh delay mean {refresh.get('since_published_mean', 0):.3f} s, "
          f"p90 {refresh.get('since_published_p90', 0):.3f} s, load "
          f"{refresh.get('load_seconds_mean', 0):.3f} s over {len(loads)} loads; "
          f"trainer wait {out['trainer_wait_fraction']:.1%}, "
          f"{out['seconds_per_step']:.3f} s/step, trained/generated "
          f"{out['trained_fraction']}, ledger {'holds' if out['ledger_holds'] else 'BROKEN'}",
          flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--raas", default="hf")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("overrides", nargs="*", help="more settings of both runs, e.g. "
                        "raas.token_seconds=0.004 with --raas sim")
    args = parser.parse_args()
    common = [f"steps={args.steps}", f"eval_every={args.steps}", f"seed={args.seed}",
              f"raas={args.raas}", f"workflow.max_new_tokens={args.max_new_tokens}",
              f"workflow.temperature={args.temperature}", *args.overrides]
    cpu = cpu_model()
    print(f"partial rollouts, raas={args.raas}, {args.steps} steps, max_new_tokens "
          f"{args.max_new_tokens}; CPU: {cpu}", flush=True)
    with tempfile.TemporaryDirectory(prefix="astraflow-partial-") as tmp:
        without = run("without", [*common, "partial_rollouts=false"], Path(tmp))
        with_ = run("with", [*common, "partial_rollouts=true"], Path(tmp))
    ratios = {
        "refresh_delay_mean": (with_["refresh"]["since_published_mean"]
                               / without["refresh"]["since_published_mean"]),
        "refresh_delay_p90": (with_["refresh"]["since_published_p90"]
                              / without["refresh"]["since_published_p90"]),
        "load_seconds_mean": (with_["refresh"]["load_seconds_mean"]
                              / without["refresh"]["load_seconds_mean"]),
        "seconds_per_step": with_["seconds_per_step"] / without["seconds_per_step"],
    }
    print("with / without: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
          + f"; trainer wait {without['trainer_wait_fraction']:.1%} -> "
          f"{with_['trainer_wait_fraction']:.1%}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu": cpu, "args": {k: str(v) for k, v in
                                                          vars(args).items()},
                                    "without": without, "with": with_, "ratios": ratios},
                                   indent=2))
    if not (without["ledger_holds"] and with_["ledger_holds"]):
        raise SystemExit("the ledger does not balance: see the by_pool counts")


if __name__ == "__main__":
    main()
