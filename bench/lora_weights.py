"""Weight bytes a node receives per version: whole model vs a rank-16 LoRA adapter.

Measured on the tiny model: the hf trainer, once training every weight and once
training rank-16 adapters on every linear layer, takes the same batches; after each
step it publishes through the real publisher into a weight store, which picks a full
snapshot or a sparse bf16 delta, whichever is smaller. A node following the stream
downloads one file per version; its bytes are what is reported (and the publish time).

For a 7B model the same figures come from shape arithmetic (Qwen2.5-7B: 28 layers,
hidden 3584, MLP 18944, 28 query and 4 key/value heads of 128, vocabulary 152064,
untied), bf16: the whole model's snapshot against a rank-16 adapter on q, k, v, o,
gate, up and down projections.

Usage: python bench/lora_weights.py [--steps 6]; writes bench/results/lora_weights.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _machine import cache_root, cpu_model

RESULTS = Path(__file__).parent / "results" / "lora_weights.json"
BF16 = 2


def qwen7b_bytes(rank: int = 16) -> dict[str, float]:
    layers, hidden, mlp, heads, kv_heads, head_dim, vocab = 28, 3584, 18944, 28, 4, 128, 152064
    q, kv = heads * head_dim, kv_heads * head_dim
    linear = {  # (in, out) of every adapted projection of one layer
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
        "o_proj": (q, hidden), "gate_proj": (hidden, mlp), "up_proj": (hidden, mlp),
        "down_proj": (mlp, hidden),
    }
    per_layer = sum(i * o + (o if name in ("q_proj", "k_proj", "v_proj") else 0)
                    for name, (i, o) in linear.items()) + 2 * hidden  # biases, norms
    params = layers * per_layer + 2 * vocab * hidden + hidden
    adapter = layers * sum(rank * (i + o) for i, o in linear.values())
    return {"model_params": params, "model_bytes": params * BF16,
            "adapter_params": adapter, "adapter_bytes": adapter * BF16}


def stream_bytes(model_dir: str, rank: int, steps: int, root: Path) -> dict[str, float]:
    from omegaconf import OmegaConf

    from astraflow.plugins import get_registry
    from astraflow.testing.trainer import arithmetic_batch, with_behaviour_logprobs
    from astraflow.weights.publisher import WeightPublisher
    from astraflow.weights.safetensors_io import from_torch
    from astraflow.weights.store import WeightStore

    entry = get_registry().get("trainer_backend", "hf")
    config = OmegaConf.structured(entry.config_cls)
    config.lora.rank = rank
    config.lr = 2e-3 if rank else 3e-4
    backend = entry.create(config, model_dir)
    store = WeightStore(root / f"rank{rank}", keep_fulls=None)
    publisher = WeightPublisher(store, "policy")

    def publish(version: int) -> float:
        t0 = time.perf_counter()
        publisher.publish(version, {k: from_torch(v) for k, v in
                                    backend.export_weights().items()})
        return time.perf_counter() - t0

    publish(0)
    sent, seconds = [], []
    for step in range(1, steps + 1):
        batch = arithmetic_batch(model_dir, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5],
                                 f"b{step}")
        backend.train_step(with_behaviour_logprobs(backend, batch))
        seconds.append(publish(step))
        plan = store.plan("policy", step - 1, step)  # what a node one version behind fetches
        sent.append(sum(ref.bytes for ref in plan))
    return {"bytes_per_version": sum(sent) / len(sent),
            "publish_seconds": sum(seconds) / len(seconds),
            "full_bytes": store.manifest("policy", steps)["model_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.tasks.arithmetic import ArithmeticTasks

    cache = cache_root()
    model = make_tiny_model(cache / "models" / "test-tiny-arithmetic-seed0", ModelConfig(),
                            seed=0, warmstart_tasks=list(ArithmeticTasks().train_tasks()))
    with tempfile.TemporaryDirectory() as tmp:
        full = stream_bytes(model, 0, args.steps, Path(tmp))
        lora = stream_bytes(model, 16, args.steps, Path(tmp))
    big = qwen7b_bytes()
    cpu = cpu_model()
    print(f"weight bytes per version, whole model vs rank-16 LoRA ({cpu}, "
          f"{os.cpu_count()} cores)")
    print(f"  tiny model: {full['bytes_per_version'] / 1e3:.1f} kB vs "
          f"{lora['bytes_per_version'] / 1e3:.1f} kB per version "
          f"({full['bytes_per_version'] / lora['bytes_per_version']:.1f}x fewer); snapshots "
          f"{full['full_bytes'] / 1e3:.0f} kB vs {lora['full_bytes'] / 1e3:.0f} kB; publish "
          f"{full['publish_seconds'] * 1e3:.1f} ms vs {lora['publish_seconds'] * 1e3:.1f} ms")
    print(f"  7B (Qwen2.5-7B shapes, bf16): {big['model_bytes'] / 1e9:.2f} GB vs "
          f"{big['adapter_bytes'] / 1e6:.1f} MB per version "
          f"({big['model_bytes'] / big['adapter_bytes']:.0f}x fewer)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "cpu": cpu, "cores": os.cpu_count(), "steps": args.steps, "tiny_full": full,
        "tiny_lora16": lora,
        "tiny_ratio": full["bytes_per_version"] / lora["bytes_per_version"],
        "qwen2.5_7b": big, "qwen2.5_7b_ratio": big["model_bytes"] / big["adapter_bytes"],
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
