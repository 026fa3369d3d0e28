"""Rollout throughput: raas=vllm vs raas=hf, and the RaaS runtime vs the bare vLLM engine.

Same tiny model (the default run's), same prompts (the arithmetic training tasks), two
workloads:

* workflow -- what a RaaS node runs: ``concurrency`` tasks in flight, each the
  single_turn workflow (group of ``group_size`` samples, stop at EOS, reward,
  trajectory) through the node's policy handle and the backend;
* decode   -- long generations (``decode_tokens`` each, no early stop), the engine's
  decode throughput through the backend API.

The runtime fraction compares those against calling vLLM's ``AsyncLLM`` directly with the
same sampling parameters, on the same engine, at the same concurrency, repetitions
interleaved so both see the same machine load. Leasing and pushing over HTTP are not in
it (bench/dataflow.py measures the data layer).

    python bench/rollout.py --out bench/results/rollout.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _machine import cache_root
from omegaconf import OmegaConf

from astraflow.components import build_workflow
from astraflow.config import ModelConfig, compose_config
from astraflow.models.tiny import make_tiny_model
from astraflow.plugins import get_registry
from astraflow.raas.engines import EnginePolicy
from astraflow.text import load_tokenizer
from astraflow.types import GenerationRequest, Task

Work = Callable[[], Awaitable[int]]  # one run of a workload; returns tokens generated


async def bounded(jobs: list[Callable[[], Awaitable[int]]], concurrency: int) -> int:
    """Run jobs with at most ``concurrency`` in flight, like a node's task slots."""
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[int]]) -> int:
        async with gate:
            return await job()

    return sum(await asyncio.gather(*(one(job) for job in jobs)))


async def tokens_per_second(work: Work) -> float:
    started = time.perf_counter()
    tokens = await work()
    return tokens / (time.perf_counter() - started)


class Setup:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cfg = compose_config([])
        tasks = get_registry().get("task", self.cfg.task.name).create(self.cfg.task)
        self.tasks: list[Task] = list(tasks.train_tasks())[: args.tasks]
        cache = cache_root()
        self.model = make_tiny_model(cache / "models" / f"tiny-arithmetic-seed{self.cfg.seed}",
                                     ModelConfig(), seed=self.cfg.seed,
                                     warmstart_tasks=list(tasks.train_tasks()))
        self.tokenizer = load_tokenizer(self.model)
        self.workflow = build_workflow(self.cfg, self.tokenizer)
        pad = [self.tokenizer.pad_token_id]  # never sampled in practice: full-length decodes
        self.decode_requests = [
            GenerationRequest(self.tokenizer.encode(t.prompt), max_new_tokens=args.decode_tokens,
                              n=args.group_size, stop_token_ids=pad)
            for t in self.tasks[: args.decode_prompts]
        ]

    def workflow_work(self, backend: Any) -> Work:
        defaults = {"max_new_tokens": self.cfg.workflow.max_new_tokens,
                    "temperature": self.cfg.workflow.temperature}
        handles = {"policy": EnginePolicy("policy", backend, defaults)}

        async def run_task(task: Task) -> int:
            trajectories = await self.workflow.run(task, handles, self.args.group_size)
            return sum(sum(t.loss_mask) for t in trajectories)

        return lambda: bounded([lambda t=t: run_task(t) for t in self.tasks],
                               self.args.concurrency)

    def decode_work(self, backend: Any) -> Work:
        async def run(req: GenerationRequest) -> int:
            return sum(len(g.token_ids) for g in await backend.generate(req))

        return lambda: bounded([lambda r=r: run(r) for r in self.decode_requests],
                               self.args.concurrency)

    def workflow_requests(self) -> list[GenerationRequest]:
        """The requests the single_turn workflow makes, for the bare engine."""
        eos = self.tokenizer.eos_token_id
        return [GenerationRequest(self.tokenizer.encode(t.prompt),
                                  max_new_tokens=self.cfg.workflow.max_new_tokens,
                                  temperature=self.cfg.workflow.temperature,
                                  n=self.args.group_size, stop_token_ids=[eos])
                for t in self.tasks]


def bare_work(backend: Any, requests: list[GenerationRequest], concurrency: int) -> Work:
    """The same requests straight into the backend's AsyncLLM: no runtime, no conversion."""
    from vllm.inputs import tokens_input

    async def run(req: GenerationRequest) -> int:
        params = backend.sampling_params(req)
        tokens = 0
        async for out in backend.engine.generate(tokens_input(req.prompt_ids), params,
                                                 request_id=uuid.uuid4().hex):
            tokens = sum(len(o.token_ids) for o in out.outputs)
        return tokens

    return lambda: bounded([lambda r=r: run(r) for r in requests], concurrency)


async def with_backend(name: str, model: str, body: Callable[[Any], Awaitable[dict]]) -> dict:
    entry = get_registry().get("rollout_backend", name)
    backend = entry.create(OmegaConf.structured(entry.config_cls), model)
    started = time.perf_counter()
    await backend.start()
    start_seconds = time.perf_counter() - started
    try:
        return {"start_seconds": round(start_seconds, 1), **await body(backend)}
    finally:
        await backend.shutdown()


async def measure(works: dict[str, Work], repeats: int) -> dict[str, float]:
    """Median tokens/s of each workload after one warm-up, repetitions interleaved."""
    for work in works.values():
        await work()
    samples: dict[str, list[float]] = {k: [] for k in works}
    for _ in range(repeats):
        for key, work in works.items():
            samples[key].append(await tokens_per_second(work))
    return {k: round(statistics.median(v), 1) for k, v in samples.items()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    setup = Setup(args)

    async def vllm_body(backend: Any) -> dict:
        return await measure({
            "workflow_runtime": setup.workflow_work(backend),
            "workflow_bare": bare_work(backend, setup.workflow_requests(), args.concurrency),
            "decode_runtime": setup.decode_work(backend),
            "decode_bare": bare_work(backend, setup.decode_requests, args.concurrency),
        }, args.repeats)

    async def hf_body(backend: Any) -> dict:
        return await measure({"workflow_runtime": setup.workflow_work(backend),
                              "decode_runtime": setup.decode_work(backend)}, args.repeats)

    vllm = await with_backend("vllm", setup.model, vllm_body)
    hf = await with_backend("hf", setup.model, hf_body)
    return {
        "bench": "rollout",
        "unit": "generated tokens per second (median of repeats)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "params": vars(args),
        "vllm": vllm,
        "hf": hf,
        "vllm_over_hf": {k: round(vllm[k] / hf[k], 2)
                         for k in ("workflow_runtime", "decode_runtime")},
        "runtime_fraction_of_bare_vllm": {
            k: round(vllm[f"{k}_runtime"] / vllm[f"{k}_bare"], 3)
            for k in ("workflow", "decode")},
        "target_runtime_fraction": 0.9,
    }


if __name__ == "__main__":  # vLLM spawns its engine core: the entry point must be guarded
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=512)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--decode-prompts", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/rollout.json")
    cli = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = asyncio.run(main(cli))
    print(json.dumps(result, indent=2))
    Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cli.out).write_text(json.dumps(result, indent=2) + "\n")
