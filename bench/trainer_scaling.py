"""Step time of one trainer at world size 1 and 2, on the same batch.

Each layout trains the same 64-sequence arithmetic batch (the tiny model's held-out
problems with their answers, mixed advantages) for a few warm-up steps and then
``--steps`` timed ones; the figure is the median step. World size 2 runs under
``torchrun`` with gloo on CPU:

- ``hf``: one process, then FSDP2 over two ranks (each trains half the batch and holds
  half of every parameter, gradient and AdamW moment);
- ``megatron``: one process, then two data-parallel replicas, tensor parallelism over
  two ranks, and two pipeline stages (one micro-batch at a time: no overlap).

Every process runs one torch thread (as under ``make test``), so on two CPU cores two
ranks use both cores where one process used one: a ratio mixes that with the cost of
sharding and of the collectives (FSDP2 gathers and reduces every layer's tensors each
micro-batch, which on a tiny model outweighs the halved work). It says what the
machinery costs, not what a GPU per rank would gain.

Prints the table and writes ``bench/results/trainer_scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model

RESULTS = Path(__file__).parent / "results" / "trainer_scaling.json"
LAYOUTS = {
    "hf": [("1 process", {}), ("FSDP2 x2", {"world_size": 2})],
    "megatron": [("1 process", {}), ("DP=2", {"world_size": 2}),
                 ("TP=2", {"world_size": 2, "tensor_model_parallel_size": 2}),
                 ("PP=2", {"world_size": 2, "pipeline_model_parallel_size": 2})],
}


def worker(backend_name: str, model_dir: str, settings: str, steps: int, out: str) -> None:
    """One rank (or the single process): time ``steps`` train steps on the batch."""
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from astraflow.plugins import get_registry
    from astraflow.testing.trainer import arithmetic_batch, with_behaviour_logprobs

    torch.set_num_threads(1)
    entry = get_registry().get("trainer_backend", backend_name)
    config = OmegaConf.merge(OmegaConf.structured(entry.config_cls), json.loads(settings))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from astraflow.trainer.ranks import init

        init(600)
    backend = entry.create(config, model_dir)
    advantages = [(-1.0) ** i * (1 + i % 3) / 2 for i in range(64)]
    batch = with_behaviour_logprobs(backend, arithmetic_batch(model_dir, advantages))
    times = []
    for i in range(steps + 2):  # two warm-up steps
        if dist.is_initialized():
            dist.barrier()
        t0 = time.perf_counter()
        backend.train_step(batch)
        if dist.is_initialized():
            dist.barrier()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"step_seconds": statistics.median(times),
                                         "tokens": int(sum(len(i.trajectory.tokens)
                                                           for i in batch.items))}))


def measure(backend_name: str, model_dir: str, settings: dict, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        args = [backend_name, model_dir, json.dumps(settings), str(steps), str(out)]
        world = settings.get("world_size", 1)
        launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={world}"] if world > 1 else [sys.executable])
        subprocess.run([*launch, __file__, "--worker", *args], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backends", default="hf,megatron")
    parser.add_argument("--worker", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, model, settings, steps, out = args.worker
        worker(name, model, settings, int(steps), out)
        return

    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.tasks.arithmetic import ArithmeticTasks
    from astraflow.testing.pytest_plugin import _models_cache

    model_dir = make_tiny_model(_models_cache() / "test-tiny-arithmetic-seed0", ModelConfig(),
                                seed=0, warmstart_tasks=list(ArithmeticTasks().train_tasks()))
    cpu = cpu_model()
    print(f"trainer step time, world size 1 vs 2 ({cpu}, {os.cpu_count()} cores, "
          f"median of {args.steps} steps)")
    rows = []
    for backend_name in args.backends.split(","):
        base = None
        for label, settings in LAYOUTS[backend_name]:
            got = measure(backend_name, model_dir, settings, args.steps)
            base = base or got["step_seconds"]
            ratio = got["step_seconds"] / base
            rows.append({"backend": backend_name, "layout": label, **settings, **got,
                         "ratio_to_one_process": ratio})
            print(f"  {backend_name:9s} {label:10s} {got['step_seconds'] * 1000:8.1f} ms/step "
                  f"  x{ratio:.2f} of one process")
    print("  (one torch thread per process on 2 cores: two ranks also get a second core, so "
          "this is the cost of the machinery, not a GPU speed-up)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"cpu": cpu, "cores": os.cpu_count(), "steps": args.steps,
                                   "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
