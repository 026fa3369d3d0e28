"""Train-step time with ``trainer.shared_prefix`` on and off, on GRPO-shaped batches.

A batch is ``--groups`` prompts x ``--group-size`` completions (random tokens, mixed
advantages, behaviour log-probs from the model), as a GRPO trainer sees it. Two shapes:

- ``default job``: the default job's shape (5-token prompts, 1-5 token completions,
  32 x 8), on the tiny model;
- ``agentic``: a long shared context and longer completions (``--prompt`` tokens,
  ``--completion`` tokens at most), on a wider model built here (``--hidden``,
  ``--layers``), as an agent's tool-laden prompt is trained.

Each shape trains ``--steps`` timed steps (after warm-up) with sharing off and on,
same weights, same batch; the figure is the median step, the ratio off / on. One torch
thread (as a trainer beside a rollout node on two cores). Also checks that both give
the same loss. Prints the table and writes ``bench/results/shared_prefix.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from _machine import cpu_model

RESULTS = Path(__file__).parent / "results" / "shared_prefix.json"


def grouped(vocab: int, groups: int, size: int, prompt: tuple[int, int],
            completion: tuple[int, int], seed: int = 0) -> list:
    from astraflow.testing.trainer import prompt_completion
    from astraflow.types import TrainItem

    rng = random.Random(seed)
    items = []
    for g in range(groups):
        context = [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt))]
        for _ in range(size):
            tokens = [rng.randrange(3, vocab) for _ in range(rng.randint(*completion))]
            trajectory = prompt_completion(f"task-{g}", context, tokens, 0.0)
            items.append(TrainItem(trajectory, rng.gauss(0.0, 1.0)))
    return items


def time_steps(model_dir: str, items: list, steps: int, settings: dict,
               stale: float = 0.0) -> tuple[float, dict]:
    """The median of ``steps`` timed train steps of the hf backend with ``settings`` on
    one batch of ``items`` (one torch thread), and the first step's metrics. Behaviour
    log-probs are the model's, moved by +-``stale`` (alternate items) as on older samples."""
    import torch
    from astraflow_trainer_hf import HFConfig
    from astraflow_trainer_hf.backend import HFTrainerBackend
    from omegaconf import OmegaConf

    from astraflow.testing.trainer import with_behaviour_logprobs
    from astraflow.types import Batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = OmegaConf.merge(OmegaConf.structured(HFConfig()), {"lr": 1e-6, **settings})
    backend = HFTrainerBackend(config, model_dir)
    batch = with_behaviour_logprobs(backend, Batch(batch_id="b", policy="policy",
                                                   items=items))
    for n, item in enumerate(batch.items):
        traj = item.trajectory
        traj.logprobs = [lp + (stale if n % 2 else -stale) * m
                         for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)]
    first = backend.train_step(batch)
    backend.train_step(batch)  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        backend.train_step(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times), first


def shapes(tmp: Path, prompt: int, completion: int, hidden: int = 256, layers: int = 4,
           groups: int = 8, group_size: int = 8) -> dict[str, tuple[str, list, int]]:
    """Name -> (model directory, items, micro-batch size) of the two batch shapes: the
    default job's on the tiny model, and the agentic one on a wider model built here."""
    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model

    tiny = make_tiny_model(tmp / "tiny", ModelConfig(warmstart_steps=0), seed=0)
    wide = make_tiny_model(tmp / "wide", ModelConfig(
        hidden_size=hidden, num_layers=layers, num_heads=4, intermediate_size=4 * hidden,
        max_position_embeddings=2 * (prompt + completion), warmstart_steps=0), seed=0)
    return {
        "default job": (tiny, grouped(40, 32, 8, (4, 6), (1, 5)), 64),
        "agentic": (wide, grouped(40, groups, group_size, (prompt // 2, prompt),
                                  (1, completion)), 8),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, (model, items, micro) in shapes(
                Path(tmp), args.prompt, args.completion, args.hidden, args.layers,
                args.groups, args.group_size).items():
            settings = {"micro_batch_size": micro}
            off, first_off = time_steps(model, items, args.steps,
                                        {**settings, "shared_prefix": False})
            on, first_on = time_steps(model, items, args.steps,
                                      {**settings, "shared_prefix": True})
            loss_off, loss_on = first_off["loss"], first_on["loss"]
            tokens = sum(len(i.trajectory.tokens) for i in items)
            rows.append({"shape": name, "sequences": len(items), "tokens": tokens,
                         "plain_seconds": off, "shared_seconds": on, "speedup": off / on,
                         "loss_plain": loss_off, "loss_shared": loss_on})
    cpu = cpu_model()
    print(f"CPU: {cpu} (one torch thread)")
    print(f"{'shape':<12} {'sequences':>9} {'tokens':>8} {'plain s':>8} {'shared s':>9} "
          f"{'plain/shared':>12}")
    for r in rows:
        print(f"{r['shape']:<12} {r['sequences']:>9} {r['tokens']:>8} "
              f"{r['plain_seconds']:>8.3f} {r['shared_seconds']:>9.3f} {r['speedup']:>11.2f}x")
        if abs(r["loss_plain"] - r["loss_shared"]) > 1e-4 * max(1.0, abs(r["loss_plain"])):
            raise SystemExit(f"{r['shape']}: losses differ ({r['loss_plain']} vs "
                             f"{r['loss_shared']})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"cpu": cpu, "args": vars(args), "rows": rows}, indent=2))
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
