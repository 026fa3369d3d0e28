"""An agent harness's second turn against its first: time to the first token with a
20k-token prompt, through the node's Messages API, on ``raas=hf`` and ``raas=vllm``.

Claude Code and Codex CLI send 26-35k tokens of instructions and tool schemas and
re-send them, with the conversation so far, every turn. The first turn's prompt is
computed whole; the second turn extends it by the reply and a tool result, so an
engine that keeps prefixes (``raas=hf``: ``raas.prefix_cache_gib``; vLLM: its prefix
cache) runs only the new tokens. Each trial is a new conversation (a fresh system
text, so nothing of an earlier trial is reused); time to first token is a request for
one token (the gateway answers a stream once it is complete). The baseline is the same
engine with its prefix keeping off (``raas=hf`` only: vLLM's is always on here).

Usage: python bench/harness_prefix.py [--tokens 20000] [--trials 3] [--raas hf,vllm]
Writes bench/results/harness_prefix.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from _machine import cache_root, machine, write_results
from omegaconf import OmegaConf

RESULTS = Path(__file__).resolve().parent / "results" / "harness_prefix.json"


def system_text(tokenizer: Any, tokens: int, seed: int) -> str:
    """Random words until the text is ``tokens`` of the tokenizer's tokens."""
    from astraflow.testing.models import default_corpus

    rng = random.Random(seed)
    words = [w for line in default_corpus() for w in line.split()]
    text = ""
    while len(tokenizer.encode(text)) < tokens:
        text += " ".join(rng.choices(words, k=2000)) + "\n"
    ids = tokenizer.encode(text)[:tokens]
    return tokenizer.decode(ids)


async def conversation(url: str, key: str, system: str) -> tuple[float, float]:
    """Seconds to the first token of turn 1 and of turn 2."""
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    tools = [{"name": "Bash", "description": "Run a command.", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    times = []
    async with httpx.AsyncClient(timeout=900) as http:
        for turn in range(2):
            started = time.perf_counter()
            reply = await http.post(f"{url}/v1/messages", headers=headers, json={
                "model": "policy", "max_tokens": 1, "system": system, "tools": tools,
                "messages": messages, "temperature": 0})
            times.append(time.perf_counter() - started)
            reply.raise_for_status()
            if turn == 0:
                messages += [{"role": "assistant", "content": reply.json()["content"] or
                              [{"type": "text", "text": "."}]},
                             {"role": "user", "content": "a.txt b.txt"}]
    return times[0], times[1]


async def one_engine(raas: str, model: str, args: argparse.Namespace,
                     **settings: Any) -> dict[str, Any]:
    from astraflow.gateway.server import Gateway, GatewaySettings
    from astraflow.plugins import get_registry
    from astraflow.raas.engines import EnginePolicy
    from astraflow.text import load_tokenizer
    from astraflow.types import Task

    tokenizer = load_tokenizer(model)
    entry = get_registry().get("rollout_backend", raas)
    config = OmegaConf.merge(OmegaConf.structured(entry.config_cls), settings)
    backend = entry.create(config, model)
    await backend.start()
    gateway = Gateway(tokenizer, GatewaySettings())
    await gateway.start()
    firsts, seconds = [], []
    try:
        for trial in range(args.trials):
            system = system_text(tokenizer, args.tokens, seed=trial)
            session = gateway.open(Task(f"t{trial}", "", ""), {
                "policy": EnginePolicy("policy", backend, {"max_new_tokens": 1})},
                group_id=f"t{trial}", sample=0)
            first, second = await conversation(gateway.url, session.key, system)
            gateway.close(session.key)
            firsts.append(first)
            seconds.append(second)
            print(f"  raas={raas} {settings or ''} trial {trial}: turn 1 {first:.2f} s, "
                  f"turn 2 {second:.2f} s", flush=True)
    finally:
        await gateway.stop()
        await backend.shutdown()
    one, two = statistics.median(firsts), statistics.median(seconds)
    return {"turn1_seconds": firsts, "turn2_seconds": seconds,
            "turn1_median": one, "turn2_median": two, "speedup": one / two}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from astraflow.testing.models import make_chat_model

    model = make_chat_model(cache_root() / "models" / "bench-chat-qwen2-128k", arch="qwen2",
                            seed=0, context=131072)
    out: dict[str, Any] = {"machine": machine(), "tokens": args.tokens}
    for raas in args.raas.split(","):
        if raas == "hf":
            out["hf"] = await one_engine("hf", model, args)
            out["hf_without_prefix_cache"] = await one_engine("hf", model, args,
                                                              prefix_cache_gib=0.0)
        else:
            out[raas] = await one_engine(raas, model, args,
                                         max_model_len=args.tokens + 4096)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--raas", default="hf,vllm")
    args = parser.parse_args()
    out = asyncio.run(main_async(args))
    print(f"\nsecond turn against first, {args.tokens}-token prompt  "
          f"({out['machine']['cpu']}, {out['machine']['cpus']} CPUs)")
    for name, row in out.items():
        if isinstance(row, dict) and "speedup" in row:
            print(f"{name:26} turn 1 {row['turn1_median']:7.2f} s  turn 2 "
                  f"{row['turn2_median']:7.2f} s  {row['speedup']:5.1f}x sooner")
    write_results(RESULTS, out)


if __name__ == "__main__":
    main()
