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

Each is timed (median of ``--steps`` steps after a warm-up, one torch thread, the same
weights and batch) as PPO and M2PO over the shape's micro-batches and as both over one
micro-batch. Prints the table and writes ``bench/results/m2po.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _machine import at_least_one, cpu_model
from shared_prefix import grouped

RESULTS = Path(__file__).parent / "results" / "m2po.json"


def time_steps(model_dir: str, items: list, steps: int, loss: str,
               micro_batch_size: int) -> tuple[float, dict]:
    import torch
    from astraflow_trainer_hf import HFConfig
    from astraflow_trainer_hf.backend import HFTrainerBackend
    from omegaconf import OmegaConf

    from astraflow.testing.trainer import with_behaviour_logprobs
    from astraflow.types import Batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = OmegaConf.merge(OmegaConf.structured(HFConfig()), {
        "loss": loss, "micro_batch_size": micro_batch_size, "lr": 1e-6})
    backend = HFTrainerBackend(config, model_dir)
    batch = with_behaviour_logprobs(backend, Batch(batch_id="b", policy="policy",
                                                   items=items))
    for n, item in enumerate(batch.items):
        traj = item.trajectory
        traj.logprobs = [lp + (0.15 if n % 2 else -0.15) * m
                         for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)]
    first = backend.train_step(batch)  # also the warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        backend.train_step(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=at_least_one, default=7)
    parser.add_argument("--prompt", type=at_least_one, default=512)
    parser.add_argument("--completion", type=at_least_one, default=64)
    args = parser.parse_args()

    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_tiny_model(Path(tmp) / "tiny", ModelConfig(warmstart_steps=0), seed=0)
        wide = make_tiny_model(Path(tmp) / "wide", ModelConfig(
            hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
            max_position_embeddings=2 * (args.prompt + args.completion),
            warmstart_steps=0), seed=0)
        shapes = {
            "default job": (tiny, grouped(40, 32, 8, (4, 6), (1, 5)), 64),
            "agentic": (wide, grouped(40, 8, 8, (args.prompt // 2, args.prompt),
                                      (1, args.completion)), 8),
        }
        for name, (model, items, micro) in shapes.items():
            whole = len(items)
            ppo, _ = time_steps(model, items, args.steps, "ppo", micro)
            split, split_first = time_steps(model, items, args.steps, "m2po", micro)
            ppo_one, _ = time_steps(model, items, args.steps, "ppo", whole)
            one, one_first = time_steps(model, items, args.steps, "m2po", whole)
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
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"cpu": cpu, "steps": args.steps, "shapes": rows},
                                  indent=2))
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
