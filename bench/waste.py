"""Waste: how much of what the rollout engines generate the trainer trains on, per engine.

The default job (``python -m astraflow``) runs once per engine (``--engines``, default
``hf vllm``), for ``--steps`` steps each (default 600 on hf; vLLM on CPU is slower, so
it runs ``--vllm-steps``, default 60). For each run, read from its ``summary.json``:

* trained / generated -- the samples trained on over those generated, the ones still
  buffered when the trainer finished (left over) excluded, and the same with them
  included (what the run cost in rollouts);
* left over, dropped as too stale, dropped for want of a trainer (generated after the
  run ended);
* trainer wait fraction and seconds per step (start-up left out);
* the ledger -- every generated sample trained, dropped or still buffered.

The first engine is the baseline: each other engine's trained / generated is also given
as a ratio to it.

Usage: python bench/waste.py [--engines hf vllm] [--steps 600] [--vllm-steps 60]
Writes bench/results/waste.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, launch

RESULTS = Path(__file__).parent / "results" / "waste.json"


def run(engine: str, steps: int, root: Path) -> dict:
    summary, _records, per_step = launch(engine, [f"raas={engine}", f"steps={steps}"], root)
    policy = summary["policies"]["policy"]
    generated, trained = policy["trajectories_generated"], policy["trajectories_trained"]
    left_over, dropped = policy["trajectories_left_over"], policy["trajectories_dropped"]
    return {
        "steps": policy["steps"],
        "generated": generated,
        "trained": trained,
        "left_over": left_over,
        "dropped_stale": dropped["stale"],
        "dropped_no_trainer": dropped["no_trainer"],
        "filtered": dropped["filtered"],
        "trained_fraction": policy["trained_fraction"],
        "trained_of_all_generated": round(trained / generated, 4) if generated else None,
        "ledger_holds": generated == trained + left_over + sum(dropped.values()),
        "trainer_wait_fraction": policy["trainer_wait_fraction"],
        "seconds_per_step": per_step,
        "first_step_seconds": policy.get("first_step_seconds"),
        "final_eval_accuracy": policy.get("final_eval_accuracy"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--vllm-steps", type=int, default=60)
    args = parser.parse_args()
    cpu = cpu_model()
    print(f"CPU: {cpu}", flush=True)
    out: dict = {"cpu": cpu, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="astraflow-waste-") as tmp:
        for engine in args.engines:
            steps = args.vllm_steps if engine == "vllm" else args.steps
            print(f"{engine}: {steps} steps ...", flush=True)
            started = time.time()
            r = out["engines"][engine] = run(engine, steps, Path(tmp))
            base = out["engines"][args.engines[0]]["trained_fraction"]
            ratio = r["trained_fraction"] / base if base else float("nan")
            print(f"{engine}: trained / generated {r['trained_fraction']:.3f} "
                  f"({ratio:.2f}x {args.engines[0]}; {r['trained_of_all_generated']:.3f} "
                  f"with the {r['left_over']} left over), {r['trained']} of "
                  f"{r['generated']}; dropped stale {r['dropped_stale']}, after the end "
                  f"{r['dropped_no_trainer']}; trainer wait {r['trainer_wait_fraction']:.1%}, "
                  f"{r['seconds_per_step']:.2f} s/step; ledger "
                  f"{'holds' if r['ledger_holds'] else 'BROKEN'} "
                  f"({time.time() - started:.0f} s)", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
