"""Train-step time with micro-batches bounded by tokens (``trainer.micro_batch_tokens``)
against micro-batches of a fixed number of sequences under the same memory bound.

A trainer's memory bounds a micro-batch's padded tokens (its sequences x the longest).
With a fixed ``micro_batch_size`` the bound must hold for the longest sequences a batch
may hold, so short ones go a few at a time too; a token budget packs short sequences
many to a micro-batch and long ones few, keeping a group's samples together.

Batches are GRPO-shaped (``shared_prefix.py``'s: random tokens, mixed advantages), two
shapes:

- ``agentic, mixed lengths``: ``--groups`` x 8, each group's context drawn from
  ``--prompt`` tokens (short tool calls and long histories in one batch) and completions
  of up to 64, on a 4-layer, 256-wide model built here;
- ``default job``: 32 x 8, 4-6 token prompts and 1-5 token completions, on the tiny
  model, where the budget equals the default's 64 sequences (nothing to gain: the check
  that packing costs nothing).

For each, the budget is ``--rows`` of the batch's longest sequences; the fixed layout is
``--rows`` sequences a micro-batch (what the same bound allows whatever the lengths).
The figure is the median of ``--steps`` timed steps (one torch thread, same weights and
batch), the ratio fixed / budget; both must give the same loss. Prints the table and
writes ``bench/results/micro_batches.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _machine import at_least_one, cpu_model, write_results
from shared_prefix import grouped, time_steps

RESULTS = Path(__file__).parent / "results" / "micro_batches.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=at_least_one, default=5)
    parser.add_argument("--groups", type=at_least_one, default=16)
    parser.add_argument("--prompt", type=at_least_one, nargs=2, default=[16, 1024],
                        metavar=("SHORTEST", "LONGEST"))
    parser.add_argument("--agentic-rows", type=at_least_one, default=4)
    args = parser.parse_args()

    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.rl.policy_gradient import spans

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        width = args.prompt[1] + 64
        wide = make_tiny_model(Path(tmp) / "wide", ModelConfig(
            hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
            max_position_embeddings=2 * width, warmstart_steps=0), seed=0)
        tiny = make_tiny_model(Path(tmp) / "tiny", ModelConfig(warmstart_steps=0), seed=0)
        cases = {
            "agentic, mixed lengths": (wide, grouped(40, args.groups, 8, tuple(args.prompt),
                                                     (1, 64)), args.agentic_rows),
            "default job": (tiny, grouped(40, 32, 8, (4, 6), (1, 5)), 64),
        }
        for name, (model, items, fixed) in cases.items():
            lengths = [len(i.trajectory.tokens) for i in items]
            groups = [i.trajectory.group_id for i in items]
            budget = fixed * max(lengths)
            layouts = {"fixed": ({"micro_batch_size": fixed}, spans(lengths, groups, fixed)),
                       "budget": ({"micro_batch_size": len(items), "micro_batch_tokens": budget},
                                  spans(lengths, groups, len(items), budget))}
            timed = {}
            for key, (settings, cut) in layouts.items():
                seconds, first = time_steps(model, items, args.steps, settings)
                timed[key] = {"seconds": seconds, "loss": first["loss"],
                              "micro_batches": len(cut),
                              "padded_tokens_max": max((e - s) * max(lengths[s:e])
                                                       for s, e in cut)}
            if abs(timed["fixed"]["loss"] - timed["budget"]["loss"]) > 1e-4 * max(
                    1.0, abs(timed["fixed"]["loss"])):
                raise SystemExit(f"{name}: the loss differs ({timed['fixed']['loss']} "
                                 f"against {timed['budget']['loss']})")
            rows.append({"shape": name, "sequences": len(items),
                         "lengths": [min(lengths), max(lengths)], "budget_tokens": budget,
                         "fixed_rows": fixed, **{f"{k}_{m}": v[m] for k, v in timed.items()
                                                 for m in v if m != "loss"},
                         "speedup": timed["fixed"]["seconds"] / timed["budget"]["seconds"]})
    cpu = cpu_model()
    print(f"CPU: {cpu} (one torch thread)")
    print(f"{'shape':<24} {'lengths':>9} {'budget':>7} | {'fixed: micro':>12} {'s':>7} | "
          f"{'budget: micro':>13} {'s':>7} | {'faster':>6}")
    for r in rows:
        print(f"{r['shape']:<24} {r['lengths'][0]:>4}-{r['lengths'][1]:<4} "
              f"{r['budget_tokens']:>7} | {r['fixed_micro_batches']:>12} "
              f"{r['fixed_seconds']:>7.3f} | {r['budget_micro_batches']:>13} "
              f"{r['budget_seconds']:>7.3f} | {r['speedup']:>5.2f}x")
    write_results(RESULTS, {"cpu": cpu, "steps": args.steps, "shapes": rows})


if __name__ == "__main__":
    main()
