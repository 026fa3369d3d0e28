"""The Tinker service's engine at a real model's shape: what a tenant costs, in memory and
in time, next to the base model every tenant shares.

A randomly initialised checkpoint of Qwen2.5-0.5B's shape (``--shape``; built once and
cached), loaded as ``astraflow tinker`` loads it (``--dtype``), then:

* memory: the process's resident size with the base model alone, then with 1 and with
  ``--tenants`` LoRA tenants (rank ``--rank``, attention and MLP) that have each taken an
  AdamW step; a tenant's share is the difference over the tenants, as a fraction of the
  base model's;
* time: one tenant's forward_backward + optim_step on ``--batch`` x ``--tokens`` tokens,
  alone and with a second tenant's steps interleaved call by call (the service's lanes):
  the ratio is what sharing the engine costs a tenant, with no barrier between them;
* sampling: ``--samples`` sequences of ``--new`` tokens as one request (num_samples=N),
  against N requests of one each (as a recipe sending one request per environment
  does) served one by one, and batched as the service batches requests waiting together.

Usage: python bench/tinker.py [--shape qwen2.5-0.5b] [--dtype float32] [--tenants 4]
Writes bench/results/tinker.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from _machine import at_least_one, cache_root, cpu_model

RESULTS = Path(__file__).resolve().parent / "results" / "tinker.json"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def step(engine, tenant: str, data) -> float:
    from astraflow_tinker.engine import AdamParams

    began = time.perf_counter()
    engine.forward_backward(tenant, data, "cross_entropy", {})
    engine.optim_step(tenant, AdamParams(learning_rate=1e-4))
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--tenants", type=at_least_one, default=4)
    p.add_argument("--rank", type=at_least_one, default=32)
    p.add_argument("--batch", type=at_least_one, default=2)
    p.add_argument("--tokens", type=at_least_one, default=128)
    p.add_argument("--samples", type=at_least_one, default=8)
    p.add_argument("--new", type=at_least_one, default=16)
    args = p.parse_args()
    import torch
    from astraflow_tinker.engine import Datum, Engine, LoraSpec

    from astraflow.testing.models import make_sized_chat_model

    torch.set_num_threads(2)
    model = make_sized_chat_model(cache_root() / "models" / f"bench-{args.shape}", args.shape)
    before = rss_mb()
    engine = Engine(model, dtype=args.dtype)
    params = sum(p.numel() for p in engine.model.parameters())
    # the weights' bytes (a checkpoint already in the dtype is mapped, not all resident)
    base = sum(p.numel() * p.element_size() for p in engine.model.parameters()) / 2**20
    resident = rss_mb() - before
    print(f"{args.shape}: {params / 1e6:.0f}M parameters, {args.dtype}; base model "
          f"{base:.0f} MB of weights, {resident:.0f} MB resident after loading ({cpu_model()})")
    rng = np.random.default_rng(0)
    data = [Datum(rows.tolist(), {"target_tokens": np.roll(rows, -1),
                                  "weights": np.ones(args.tokens, np.float32)})
            for rows in rng.integers(10, 390, (args.batch, args.tokens))]
    spec = LoraSpec(rank=args.rank, train_unembed=False)
    sizes = []
    for i in range(args.tenants):
        engine.create(f"t{i}", spec)
        step(engine, f"t{i}", data)
        sizes.append(rss_mb())
    per_tenant = (sizes[-1] - sizes[0]) / max(1, args.tenants - 1)
    adapter = sum(p.numel() for p in engine._adapter_params(engine._tenants["t0"].adapter)
                  .values())
    # what a tenant holds by design: float32 adapter weights and two AdamW moments
    expected = adapter * 12 / 2**20
    print(f"  a tenant (rank {args.rank}: {adapter / 1e6:.1f}M adapter parameters, AdamW): "
          f"{per_tenant:.0f} MB resident ({expected:.0f} MB of weights and moments) = "
          f"{per_tenant / base:.3f} x the base model's weights")
    alone = statistics.median(step(engine, "t0", data) for _ in range(3))
    shared = []
    for _ in range(3):  # t0 and t1 call by call, as two lanes are served
        began = time.perf_counter()
        from astraflow_tinker.engine import AdamParams

        engine.forward_backward("t0", data, "cross_entropy", {})
        engine.forward_backward("t1", data, "cross_entropy", {})
        engine.optim_step("t0", AdamParams(learning_rate=1e-4))
        engine.optim_step("t1", AdamParams(learning_rate=1e-4))
        shared.append(time.perf_counter() - began)
    both = statistics.median(shared)
    print(f"  step ({args.batch} x {args.tokens} tokens): alone {alone:.2f} s; two tenants "
          f"interleaved {both:.2f} s for both = {both / alone:.2f} x one alone")
    prompt = data[0].tokens[:32]  # one prompt: N requests of it are a group's
    began = time.perf_counter()
    engine.sample("t0", prompt, args.samples, args.new, seed=1, stop=[])
    batched = time.perf_counter() - began
    began = time.perf_counter()
    for i in range(args.samples):
        engine.sample("t0", prompt, 1, args.new, seed=i, stop=[])
    single = time.perf_counter() - began
    from astraflow_tinker.sampling import SampleRequest

    began = time.perf_counter()
    engine.sample_many("t0", [SampleRequest(prompt, 1, args.new, i)
                               for i in range(args.samples)], stop=[])
    together = time.perf_counter() - began
    print(f"  sampling {args.samples} x {args.new} tokens: one request {batched:.2f} s; "
          f"{args.samples} requests one by one {single:.2f} s = {single / batched:.2f} x, "
          f"batched as the service batches them {together:.2f} s = "
          f"{together / batched:.2f} x")
    result = {"cpu": cpu_model(), "shape": args.shape, "dtype": args.dtype,
              "parameters": params, "base_mb": base, "base_resident_mb": resident,
              "tenant_mb": per_tenant,
              "tenant_over_base": per_tenant / base, "adapter_parameters": adapter,
              "tenant_weights_and_moments_mb": expected,
              "step_alone_s": alone, "two_tenants_interleaved_s": both,
              "interleaved_over_alone": both / alone, "sample_one_request_s": batched,
              "sample_separate_requests_s": single, "separate_over_one": single / batched,
              "sample_requests_batched_s": together, "batched_over_one": together / batched,
              "args": vars(args)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
