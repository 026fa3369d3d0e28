"""A RaaS node's engine and gateway on a background event loop, for the real ``openai``
client to call from the test's thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from omegaconf import OmegaConf

from astraflow.testing.engine import LoopThread
from astraflow.types import Generation, Task


def tool_examples() -> list[Task]:
    """The tiny model's tool format: ``a+b=`` -> ``calc(a+b)``; after the result
    ``=c,`` -> ``c``. Warm-started on these, it calls the calculator, then answers."""
    out = []
    for a in range(10):
        for b in range(10):
            q = f"{a}+{b}="
            out.append(Task(f"c{a}{b}", q, f"calc({a}+{b})"))
            out.append(Task(f"r{a}{b}", f"{q}calc({a}+{b})={a + b},", str(a + b)))
    return out


@pytest.fixture(scope="session")
def tool_model_dir() -> str:
    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.testing.pytest_plugin import _models_cache

    return make_tiny_model(_models_cache() / "test-tiny-calculator-seed0",
                           ModelConfig(warmstart_steps=400), seed=0,
                           warmstart_tasks=tool_examples())


class SpyBackend:
    """The real engine, every generation it returns kept (the ground truth of what was
    sampled)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.sampled: list[Generation] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def generate(self, request):
        out = await self.backend.generate(request)
        self.sampled.extend(out)
        return out


@dataclass
class Node:
    loop: LoopThread
    gateway: Any
    policies: dict[str, Any]
    spies: dict[str, SpyBackend]
    tokenizer: Any
    model_dir: str
    sessions: list[Any] = field(default_factory=list)

    def open(self, task: Task, models: list[str] | None = None, sample: int = 0):
        policies = {m: self.policies[m] for m in (models or list(self.policies))}
        return self.gateway.open(task, policies, group_id=task.task_id, sample=sample)

    def client(self, session, **kw):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.gateway.url}/v1", api_key=session.key, max_retries=0,
                      timeout=60, **kw)


def start_node(model_dir: str, names: tuple[str, ...] = ("policy",), **settings) -> Node:
    from astraflow.gateway.server import Gateway, GatewaySettings
    from astraflow.plugins import get_registry
    from astraflow.raas.engines import EnginePolicy
    from astraflow.text import load_tokenizer

    tok = load_tokenizer(model_dir)
    loop = LoopThread()
    entry = get_registry().get("rollout_backend", "hf")
    spies, policies = {}, {}
    for name in names:
        backend = entry.create(OmegaConf.structured(entry.config_cls), model_dir)
        loop.run(backend.start())
        spies[name] = SpyBackend(backend)
        policies[name] = EnginePolicy(name, spies[name], {"max_new_tokens": 16})
    gateway = Gateway(tok, GatewaySettings(**settings))
    loop.run(gateway.start())
    return Node(loop, gateway, policies, spies, tok, model_dir)


def stop_node(node: Node) -> None:
    node.loop.run(node.gateway.stop())
    for spy in node.spies.values():
        node.loop.run(spy.backend.shutdown())
    node.loop.close()


@pytest.fixture(scope="module")
def node(tool_model_dir):
    n = start_node(tool_model_dir, ("policy", "verifier"))
    yield n
    stop_node(n)
