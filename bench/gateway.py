"""Rollouts per second through the OpenAI-compatible endpoint vs the node's policy handle.

Same engine (raas=hf, the default run's tiny model), same tasks, same sampling, same
number of tasks in flight; one rollout (a prompt, one sampled answer, its reward)
written two ways:

* handle  -- a workflow on the policy handle: token ids straight to the engine, one
  request per rollout;
* gateway -- ``workflow=agent`` with an agent on the ``openai`` client: one chat
  completion per rollout over HTTP on 127.0.0.1, messages rendered, the call recorded,
  the trajectory rebuilt from the recording.

Target: gateway/handle >= 0.8. For scale it also reports ``workflow=single_turn``,
which samples a task's whole group in one request (n=8) -- a batching an agent, one
conversation per rollout, does not have. Repetitions are interleaved so all see the
same machine load; the CPU is named in the result.

    python bench/gateway.py --out bench/results/gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from astraflow.components import build_workflow
from astraflow.config import ModelConfig, compose_config
from astraflow.contracts import Workflow
from astraflow.models.tiny import make_tiny_model
from astraflow.plugins import get_registry
from astraflow.raas.node import EnginePolicy
from astraflow.text import load_tokenizer
from astraflow.types import Trajectory
from astraflow.workflows.builder import TrajectoryBuilder

AGENTS = {
    # one client per rollout, as most agents are written
    "per_rollout": '''
from openai import AsyncOpenAI


async def run(task, client):
    async with AsyncOpenAI(base_url=client.base_url, api_key=client.api_key,
                           max_retries=0) as api:
        await api.chat.completions.create(model=client.model, max_tokens=MAX_TOKENS,
                                          messages=[{"role": "user", "content": task.prompt}])
''',
    # one connection pool for every rollout of the process (aiohttp: httpx's pool slows
    # down with the number of requests waiting in it)
    "shared_aiohttp": '''
from openai import AsyncOpenAI, DefaultAioHttpClient

_http = None


async def run(task, client):
    global _http
    if _http is None:
        _http = DefaultAioHttpClient()
    api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, http_client=_http,
                      max_retries=0)
    await api.chat.completions.create(model=client.model, max_tokens=MAX_TOKENS,
                                      messages=[{"role": "user", "content": task.prompt}])
''',
}


class PerRollout(Workflow):
    """The agent's rollout written against the policy handle: one request per rollout."""

    async def run(self, task, policies, group_size) -> list[Trajectory]:
        return list(await asyncio.gather(*(self._one(task, policies["policy"], i)
                                           for i in range(group_size))))

    async def _one(self, task, policy, index) -> Trajectory:
        prompt = self.tokenizer.encode_prompt(task.prompt)
        (gen,) = await policy.generate(prompt, n=1, max_new_tokens=self.config.max_tokens,
                                       stop_token_ids=self.tokenizer.stop_token_ids)
        builder = TrajectoryBuilder(task.task_id, task.metadata["group_id"])
        builder.add_context(prompt)
        builder.add_generation("policy", gen)
        score = await self.score(task, self.completion_text(gen.token_ids))
        return builder.build("policy", score.value, {"sample": index, **score.metadata()})


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


async def rollouts_per_second(workflow: Any, policies: dict[str, Any], tasks: list[Any],
                              group_size: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Any) -> int:
        async with gate:
            task.metadata["group_id"] = task.task_id
            trajectories = await workflow.run(task, policies, group_size)
            return len(trajectories)

    started = time.perf_counter()
    done = sum(await asyncio.gather(*(one(t) for t in tasks)))
    return done / (time.perf_counter() - started)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cfg = compose_config([f"workflow.max_new_tokens={args.max_tokens}"])
    source = get_registry().get("task", cfg.task.name).create(cfg.task)
    train = list(source.train_tasks())
    cache = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))
    model = make_tiny_model(cache / "models" / f"tiny-arithmetic-seed{cfg.seed}", ModelConfig(),
                            seed=cfg.seed, warmstart_tasks=train)
    tokenizer = load_tokenizer(model)
    entry = get_registry().get("rollout_backend", "hf")
    backend = entry.create(OmegaConf.structured(entry.config_cls), model)
    await backend.start()
    policies = {"policy": EnginePolicy("policy", backend, {"max_new_tokens": args.max_tokens})}
    batched = build_workflow(cfg, tokenizer)
    reward = get_registry().get("reward", cfg.reward.name).create(cfg.reward)
    handle = PerRollout(OmegaConf.create({"max_tokens": args.max_tokens}), tokenizer, reward)
    tasks = train[: args.tasks]
    with tempfile.TemporaryDirectory() as tmp:
        order = [("handle", handle)]
        for name, source in AGENTS.items():
            agent_file = Path(tmp) / f"agent_{name}.py"
            agent_file.write_text(source.replace("MAX_TOKENS", str(args.max_tokens)))
            agent_cfg = compose_config(["workflow=agent", f"agent.path={agent_file}",
                                        f"agent.max_tokens={args.max_tokens}"])
            order.append((f"gateway_{name}", build_workflow(agent_cfg, tokenizer)))
        order.append(("single_turn_n8", batched))
        figures: dict[str, list[float]] = {name: [] for name, _ in order}
        # one warm-up each: the first calls pay for imports and connections
        for _name, workflow in order:
            await rollouts_per_second(workflow, policies, tasks[:8], args.group_size,
                                      args.concurrency)
        for rep in range(args.repeats):
            for name, workflow in order if rep % 2 == 0 else order[::-1]:
                rate = await rollouts_per_second(workflow, policies, tasks, args.group_size,
                                                 args.concurrency)
                figures[name].append(rate)
                print(f"rep {rep} {name:24s} {rate:8.1f} rollouts/s", flush=True)
        for name, workflow in order:
            if name.startswith("gateway_"):
                http = workflow.function.__globals__.get("_http")
                if http is not None:
                    await http.aclose()
                await workflow.aclose()
    await backend.shutdown()
    rates = {name: statistics.median(values) for name, values in figures.items()}
    ratios = {name: rate / rates["handle"] for name, rate in rates.items()
              if name.startswith("gateway_")}
    return {
        "benchmark": "gateway",
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "settings": vars(args),
        "rollouts_per_second": rates,
        "runs": figures,
        "ratio_vs_handle": ratios,
        "target": 0.8,
        "meets_target": max(ratios.values()) >= 0.8,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/gateway.json")
    cli = parser.parse_args()
    result = asyncio.run(main(cli))
    rates = result["rollouts_per_second"]
    for name, ratio in result["ratio_vs_handle"].items():
        print(f"{result['machine']['cpu']}: {name} {rates[name]:.1f} vs handle "
              f"{rates['handle']:.1f} rollouts/s = {ratio:.2f}x (target >= 0.8)")
    Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cli.out).write_text(json.dumps(result, indent=2) + "\n")
