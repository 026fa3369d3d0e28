"""Rollouts per second through the OpenAI-compatible endpoint vs the node's policy handle.

Same engine, same model, same tasks, same sampling, same number of rollouts in flight;
one rollout (a chat prompt, one sampled answer, its reward) written two ways:

* handle  -- a workflow on the policy handle: token ids straight to the engine, one
  request per rollout;
* gateway -- ``workflow=agent`` with an agent on the ``openai`` client (one shared
  aiohttp pool): one chat completion per rollout over HTTP on 127.0.0.1, messages
  rendered through the chat template, the call recorded, the trajectory rebuilt from
  the recording. Measured with the agent on the node's own event loop
  (``agent.workers=0``), in one worker process, and in the default number of them
  (one per CPU, at most 4).

The model is a Qwen3-shaped checkpoint with a BPE tokenizer and ChatML template, built
locally with random weights, so answers run to ``max_tokens``: 8 tokens (a short tool
call, where per-call overhead shows most), 64 and 256 (agent turns). Engines:

* ``sim``  -- an accelerator stand-in: a call takes ``--sim-generation-seconds`` plus
  ``--sim-token-seconds`` per decode step and no CPU, as a GPU engine's compute would;
  what remains on the CPU is what the node and the agent spend per call;
* ``vllm`` -- vLLM on CPU (continuous batching; its compute shares the cores);
* ``hf``   -- the transformers engine on CPU (request-level batching).

Target: gateway/handle >= 0.8. Repetitions are interleaved so all see the same machine
load; the CPU is named in the result.

``--runs``: the same comparison end to end, as a user meets it -- whole runs of ``python -m
astraflow`` (data layer, node, trainer, evaluator) on the tiny model: ``workflow=single_turn``
against ``workflow=agent`` with ``examples/agent/answer_agent.py`` (one call a rollout), and
the calculator example (up to three calls and its tool). Each reports trajectories/s from
the end of step 1 to the last (start-up left out) and the trainer's wait fraction.
Targets: the one-call agent >= 0.5x single_turn's trajectories/s; the calculator's
trainer waits <= 30%.

    python bench/gateway.py --out bench/results/gateway.json
    python bench/gateway.py --runs --steps 60 --out bench/results/gateway_runs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import cache_root, launch, machine
from omegaconf import OmegaConf

from astraflow.components import build_workflow
from astraflow.config import ModelConfig, compose_config
from astraflow.contracts import Workflow
from astraflow.models.tiny import make_tiny_model
from astraflow.plugins import get_registry
from astraflow.raas.engines import EnginePolicy
from astraflow.text import load_tokenizer
from astraflow.types import Trajectory
from astraflow.workflows.agent import default_workers
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
    # one client for every rollout of the process, the rollout's key sent per request
    # (a new client computes its platform headers on a thread at its first call)
    "shared_client": '''
from openai import AsyncOpenAI, DefaultAioHttpClient

_api = None


async def run(task, client):
    global _api
    if _api is None:
        _api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key,
                           http_client=DefaultAioHttpClient(), max_retries=0)
    await _api.chat.completions.create(model=client.model, max_tokens=MAX_TOKENS,
                                       messages=[{"role": "user", "content": task.prompt}],
                                       extra_headers=client.headers)
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


def build_model(kind: str, cfg: Any, train: list[Any]) -> str:
    cache = cache_root()
    if kind == "tiny":  # answers in a few tokens, then EOS
        return make_tiny_model(cache / "models" / f"tiny-arithmetic-seed{cfg.seed}",
                               ModelConfig(), seed=cfg.seed, warmstart_tasks=train)
    # a Qwen3-shaped checkpoint with a BPE tokenizer and ChatML template; random weights
    # rarely sample EOS, so every answer runs to max_tokens, as long agent turns do
    from astraflow.testing.models import make_chat_model

    return make_chat_model(cache / "models" / "bench-qwen3-chat-seed0", arch="qwen3")


async def one_length(args: argparse.Namespace, backend: Any, tokenizer: Any, reward: Any,
                     tasks: list[Any], max_tokens: int, tmp: Path) -> dict[str, Any]:
    policies = {"policy": EnginePolicy("policy", backend, {"max_new_tokens": max_tokens})}
    handle = PerRollout(OmegaConf.create({"max_tokens": max_tokens}), tokenizer, reward)
    order: list[tuple[str, Any]] = [("handle", handle)]
    for agent in args.agents.split(","):
        agent_file = tmp / f"agent_{agent}_{max_tokens}.py"
        agent_file.write_text(AGENTS[agent].replace("MAX_TOKENS", str(max_tokens)))
        for workers in sorted({int(w) for w in args.workers.split(",")} | {default_workers()}):
            agent_cfg = compose_config(["workflow=agent", f"agent.path={agent_file}",
                                        f"agent.max_tokens={max_tokens}",
                                        f"agent.workers={workers}"])
            order.append((f"gateway_{agent}_workers{workers}",
                          build_workflow(agent_cfg, tokenizer)))
    figures: dict[str, list[float]] = {name: [] for name, _ in order}
    # one warm-up each: the first calls pay for imports, processes and connections
    for _name, workflow in order:
        await rollouts_per_second(workflow, policies, tasks[:8], args.group_size,
                                  args.concurrency)
    for rep in range(args.repeats):
        for name, workflow in order if rep % 2 == 0 else order[::-1]:
            rate = await rollouts_per_second(workflow, policies, tasks, args.group_size,
                                             args.concurrency)
            figures[name].append(rate)
            print(f"max_tokens={max_tokens} rep {rep} {name:32s} {rate:8.1f} rollouts/s",
                  flush=True)
    for name, workflow in order:
        if name.startswith("gateway_"):
            http = workflow.function.__globals__.get("_http")
            if http is not None:  # the in-process agent's pool (workers=0)
                await http.aclose()
                workflow.function.__globals__["_http"] = None
            await workflow.aclose()
    rates = {name: statistics.median(values) for name, values in figures.items()}
    return {"rollouts_per_second": rates, "runs": figures,
            "ratio_vs_handle": {name: rate / rates["handle"] for name, rate in rates.items()
                                if name != "handle"}}


async def one_engine(args: argparse.Namespace, raas: str, model: str, tokenizer: Any,
                     reward: Any, tasks: list[Any]) -> dict[str, Any]:
    entry = get_registry().get("rollout_backend", raas)
    settings = OmegaConf.structured(entry.config_cls)
    if raas == "sim":
        settings.generation_seconds = args.sim_generation_seconds
        settings.token_seconds = args.sim_token_seconds
    backend = entry.create(settings, model)
    await backend.start()
    lengths: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for max_tokens in (int(n) for n in args.max_tokens.split(",")):
                print(f"-- raas={raas} max_tokens={max_tokens}", flush=True)
                lengths[str(max_tokens)] = await one_length(
                    args, backend, tokenizer, reward, tasks, max_tokens, Path(tmp))
    finally:
        await backend.shutdown()
    return lengths


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "agent"
#: the end-to-end runs: name -> overrides (each also gets steps, seed and eval settings)
RUNS = {
    "single_turn": ["workflow=single_turn"],
    "agent_one_call": ["workflow=agent", f"agent.path={EXAMPLES / 'answer_agent.py'}"],
    "agent_calculator": ["workflow=agent", f"agent.path={EXAMPLES / 'calculator_agent.py'}"],
}


def end_to_end(args: argparse.Namespace) -> dict[str, Any]:
    """Whole runs, one after another (each alone on the machine), ``--repeats`` rounds in
    alternating order."""
    names = list(RUNS)
    figures: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name in names if rep % 2 == 0 else names[::-1]:
                overrides = [*RUNS[name], f"steps={args.steps}", f"seed={rep}",
                             f"eval_every={args.eval_every}"]
                summary, _records, step_seconds = launch(f"{name}-{rep}", overrides,
                                                         Path(tmp))
                policy = summary["policies"]["policy"]
                batch = policy["trajectories_trained"] / policy["steps"]
                one = {"trajectories_per_second": batch / step_seconds,
                       "step_seconds": step_seconds,
                       "trainer_wait_fraction": policy["trainer_wait_fraction"],
                       "trained_fraction": policy["trained_fraction"],
                       "wall_seconds": summary["wall_seconds"]}
                figures[name].append(one)
                print(f"rep {rep} {name:18s} {one['trajectories_per_second']:7.1f} "
                      f"trajectories/s, step {step_seconds * 1000:6.1f} ms, trainer waits "
                      f"{one['trainer_wait_fraction']:.0%}", flush=True)
    median = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
              for name, runs in figures.items()}
    base = median["single_turn"]["trajectories_per_second"]
    return {
        "benchmark": "gateway_runs",
        "machine": machine(),
        "settings": vars(args),
        "runs": figures,
        "median": median,
        "ratio_vs_single_turn": {name: m["trajectories_per_second"] / base
                                 for name, m in median.items() if name != "single_turn"},
        "targets": {"agent_one_call_vs_single_turn": 0.5,
                    "agent_calculator_trainer_wait": 0.30},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cfg = compose_config([])
    source = get_registry().get("task", cfg.task.name).create(cfg.task)
    train = list(source.train_tasks())
    model = build_model(args.model, cfg, train)
    tokenizer = load_tokenizer(model)
    reward = get_registry().get("reward", cfg.reward.name).create(cfg.reward)
    engines = {raas: await one_engine(args, raas, model, tokenizer, reward,
                                      train[: args.tasks])
               for raas in args.raas.split(",")}
    default = f"gateway_shared_aiohttp_workers{default_workers()}"
    return {
        "benchmark": "gateway",
        "machine": machine(),
        "settings": vars(args),
        "engines": engines,
        "default_setup": default,
        "ratio_vs_handle_default_setup": {
            raas: {n: r["ratio_vs_handle"].get(default) for n, r in lengths.items()}
            for raas, lengths in engines.items()},
        "target": 0.8,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raas", default="sim,vllm,hf",
                        help="engines to measure, comma-separated")
    parser.add_argument("--sim-generation-seconds", type=float, default=0.05,
                        help="raas=sim: seconds per call before the first token")
    parser.add_argument("--sim-token-seconds", type=float, default=0.02,
                        help="raas=sim: seconds per decode step (an accelerator's, batched)")
    parser.add_argument("--model", choices=("chat", "tiny"), default="chat")
    parser.add_argument("--max-tokens", default="8,64,256",
                        help="answer lengths to measure, comma-separated")
    parser.add_argument("--agents", default="shared_aiohttp",
                        help=f"comma-separated, of: {', '.join(AGENTS)}")
    parser.add_argument("--workers", default="0,1",
                        help="agent.workers settings to measure, besides this machine's "
                             "default (one per CPU, at most 4)")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default: bench/results/gateway.json, "
                        "with --runs gateway_runs.json")
    parser.add_argument("--runs", action="store_true",
                        help="whole runs: single_turn vs the agent examples (see above)")
    parser.add_argument("--steps", type=int, default=60, help="--runs: steps per run")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="--runs: eval_every of each run (0: at the start and the end)")
    cli = parser.parse_args()
    cli.out = cli.out or f"bench/results/gateway{'_runs' if cli.runs else ''}.json"
    result = end_to_end(cli) if cli.runs else asyncio.run(main(cli))
    cpu = result["machine"]["cpu"]
    if cli.runs:
        for name, ratio in result["ratio_vs_single_turn"].items():
            m = result["median"][name]
            print(f"{cpu}: {name} {m['trajectories_per_second']:.1f} trajectories/s = "
                  f"{ratio:.2f}x single_turn's "
                  f"{result['median']['single_turn']['trajectories_per_second']:.1f}; "
                  f"trainer waits {m['trainer_wait_fraction']:.0%} (single_turn "
                  f"{result['median']['single_turn']['trainer_wait_fraction']:.0%})")
    for raas, lengths in result.get("engines", {}).items():
        for length, figures in lengths.items():
            rates = figures["rollouts_per_second"]
            for name, ratio in figures["ratio_vs_handle"].items():
                print(f"{cpu}: raas={raas} max_tokens={length} {name} {rates[name]:.1f} vs "
                      f"handle {rates['handle']:.1f} rollouts/s = {ratio:.2f}x")
    Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cli.out).write_text(json.dumps(result, indent=2) + "\n")
