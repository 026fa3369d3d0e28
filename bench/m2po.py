"""Train-step time of ``trainer.loss=m2po`` against ``ppo``, over micro-batches and over one.

M2PO's clip bounds are the whole batch's, from the second moment of its tokens' log
ratios, so they are known only once every micro-batch's log-probs are: over several
micro-batches a no-grad pass over the batch goes before the training pass; over one
(``micro_batch_size`` >= the batch) the training pass gives them itself.

Batches are GRPO-shaped (as ``shared_prefix.py``'s: random tokens, mixed advantages) and
stale: behaviour log-probs from the model, moved by +-0.15 so the bounds are active at
the default ``m2po_tau``, as on samples a few versions old. Two shapes:

- ``default job``: 32 x 8, 5-token prompts, 1-5 token completions, on the tiny model;
- ``agentic``: 8 x 8, a long shared context and longer completions, on a wider model
  built here.

Each is timed (median of ``--steps`` steps after two, one torch thread, the same
weights and batch) as PPO and M2PO over the shape's micro-batches and as both over one
micro-batch. Prints the table and writes ``bench/results/m2po.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _machine import at_least_one, cpu_model, write_results
from shared_prefix import shapes, time_steps

RESULTS = Path(__file__).parent / "results" / "m2po.json"
#: how far behaviour log-probs are moved (+-, alternate items): M2PO's bounds are active
#: at the default ``m2po_tau`` (0.01), as on samples a few versions old
STALE = 0.15


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=at_least_one, default=7)
    parser.add_argument("--prompt", type=at_least_one, default=512)
    parser.add_argument("--completion", type=at_least_one, default=64)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, items, micro) in shapes(Path(tmp), args.prompt,
                                                  args.completion).items():
            whole = len(items)

            timed = {(loss, size): time_steps(model, items, args.steps, {
                "loss": loss, "micro_batch_size": size}, stale=STALE)
                for loss in ("ppo", "m2po") for size in (micro, whole)}
            (ppo, _), (ppo_one, _) = timed["ppo", micro], timed["ppo", whole]
            (split, split_first), (one, one_first) = timed["m2po", micro], timed["m2po", whole]
            if not one_first.get("m2po_clip_active"):
                raise SystemExit(f"{name}: the M2PO bound was not active; the batch is "
                                 "not stale enough to time it")
            if abs(one_first["m2po_eps_high"] - split_first["m2po_eps_high"]) > 1e-6:
                raise SystemExit(f"{name}: the bounds differ over one micro-batch and over "
                                 f"{micro} ({one_first['m2po_eps_high']} against "
                                 f"{split_first['m2po_eps_high']})")
            rows.append({
                "shape": name, "sequences": whole,
                "micro_batches": -(-whole // micro),
                "tokens": sum(len(i.trajectory.tokens) for i in items),
                "ppo_seconds": ppo, "m2po_seconds": split,
                "ppo_one_micro_batch_seconds": ppo_one, "m2po_one_micro_batch_seconds": one,
                "m2po_over_ppo": split / ppo,
                "m2po_over_ppo_one_micro_batch": one / ppo_one,
                "m2po_speedup_one_micro_batch": split / one})
    cpu = cpu_model()
    print(f"CPU: {cpu} (one torch thread)")
    print(f"{'shape':<12} {'micro':>5} {'ppo s':>7} {'m2po s':>7} {'ratio':>6} | "
          f"{'one micro-batch: ppo s':>22} {'m2po s':>7} {'ratio':>6} | {'m2po faster':>11}")
    for r in rows:
        print(f"{r['shape']:<12} {r['micro_batches']:>5} {r['ppo_seconds']:>7.3f} "
              f"{r['m2po_seconds']:>7.3f} {r['m2po_over_ppo']:>5.2f}x | "
              f"{r['ppo_one_micro_batch_seconds']:>22.3f} "
              f"{r['m2po_one_micro_batch_seconds']:>7.3f} "
              f"{r['m2po_over_ppo_one_micro_batch']:>5.2f}x | "
              f"{r['m2po_speedup_one_micro_batch']:>10.2f}x")
    write_results(RESULTS, {"cpu": cpu, "steps": args.steps, "shapes": rows})


if __name__ == "__main__":
    main()
