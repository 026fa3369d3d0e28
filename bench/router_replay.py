"""Router replay: the trainer-vs-engine log-prob gap and the routing that differs, with
and without replay, on the same samples.

The engine (``raas=hf``) samples in bfloat16 and the trainer (``trainer=hf``) computes
in float32, as a GPU cluster does. For each model -- the tiny Qwen3-MoE and a tiny
Mixtral (four experts, top-2), each as made and with its routers scaled down so their
experts score closely (a trained router often does) -- one batch is sampled with
routing recorded, and a trainer step is taken on it without and with replay. A dense
model of the same architecture and size (Qwen3, Mistral), sampled and trained the same
way, gives the gap precision alone leaves. Figures are ratios against the run without replay.

Usage: python bench/router_replay.py [--prompts 6] [--samples 8]
Writes bench/results/router_replay.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _machine import cpu_model

from astraflow.testing.models import make_chat_model
from astraflow.testing.moe import close_router_copy, sampled, step

RESULTS = Path(__file__).parent / "results" / "router_replay.json"
#: each MoE architecture and the dense one it is built from
DENSE_OF = {"qwen3_moe": "qwen3", "mixtral": "mistral"}
KEYS = ("rollout_logprob_gap_fresh", "rollout_logprob_gap_max", "routing_mismatch",
        "routing_difference")


def figures(metrics: dict) -> dict:
    return {k: metrics[k] for k in KEYS if k in metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8, help="samples a prompt")
    parser.add_argument("--scale", type=float, default=0.05,
                        help="the close routers' weights, times the model's")
    args = parser.parse_args()
    from astraflow.testing.moe import PROMPTS

    prompts = tuple((PROMPTS * (args.prompts // len(PROMPTS) + 1))[: args.prompts])
    results: dict = {"config": vars(args), "cpu": cpu_model(), "models": {}}
    print(f"CPU: {results['cpu']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="astraflow-router-replay-") as tmp:
        root = Path(tmp)
        results["dense"] = {}
        for arch, dense_arch in DENSE_OF.items():
            dense_dir = make_chat_model(root / dense_arch, arch=dense_arch, seed=0)
            dense = figures(step(dense_dir, sampled(dense_dir, record=False, prompts=prompts,
                                                    n=args.samples), replay=False))
            results["dense"][dense_arch] = dense
            print(f"{dense_arch} (dense): mean gap {dense['rollout_logprob_gap_fresh']:.5f}, "
                  f"max {dense['rollout_logprob_gap_max']:.5f}", flush=True)
            made = make_chat_model(root / arch, arch=arch, seed=0)
            for name, model in ((arch, made), (f"{arch}, close routers",
                                               close_router_copy(made, root / f"{arch}-close",
                                                                 args.scale))):
                items = sampled(model, prompts=prompts, n=args.samples)
                plain = figures(step(model, items, replay=False))
                replay = figures(step(model, items, replay=True))
                row = {"without": plain, "with": replay, "tokens": sum(
                    sum(i.trajectory.loss_mask) for i in items)}
                row["gap_mean_ratio"] = (replay["rollout_logprob_gap_fresh"]
                                         / plain["rollout_logprob_gap_fresh"])
                row["gap_max_ratio"] = (replay["rollout_logprob_gap_max"]
                                        / plain["rollout_logprob_gap_max"])
                row["gap_mean_over_dense"] = (replay["rollout_logprob_gap_fresh"]
                                              / dense["rollout_logprob_gap_fresh"])
                results["models"][name] = row
                print(f"{name}: routing differs on {plain['routing_difference']:.2%} of "
                      f"(token, layer) pairs without replay, {replay['routing_difference']:.2%}"
                      f" with; mean gap {plain['rollout_logprob_gap_fresh']:.5f} -> "
                      f"{replay['rollout_logprob_gap_fresh']:.5f} "
                      f"({row['gap_mean_ratio']:.2f}x; {row['gap_mean_over_dense']:.2f}x the "
                      f"dense model's), max {plain['rollout_logprob_gap_max']:.5f} -> "
                      f"{replay['rollout_logprob_gap_max']:.5f} ({row['gap_max_ratio']:.2f}x)",
                      flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
