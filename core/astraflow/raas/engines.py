"""The engines a RaaS node (or an evaluator) serves its policies from, and the handle a
workflow generates through.

One engine per policy, or in a LoRA run one engine for every policy, each an adapter
of ``model.path`` (:func:`start_engines`); :class:`ServedPolicy` is one policy on its
engine (generation, loading a version it was sent), :class:`EnginePolicy` the
token-level handle workflows call (the policy-handle contract).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from astraflow.contracts import RolloutBackend
from astraflow.plugins import get_registry
from astraflow.raas.settings import NodeSettings
from astraflow.types import Generation, GenerationRequest
from astraflow.weights.base import BaseMismatchError

log = logging.getLogger("astraflow.raas")


class ServedPolicy:
    """One policy as this node's engine serves it: a whole engine of its own, or one
    LoRA adapter (named after the policy) of an engine shared by every policy."""

    def __init__(self, name: str, backend: RolloutBackend, adapter: bool) -> None:
        self.name, self.backend, self.adapter = name, backend, adapter
        #: of the last load, the seconds spent waiting for the generations in flight to
        #: finish before it (None: swapped in under them, with partial rollouts)
        self.drained: float | None = None

    @property
    def version(self) -> int:
        if self.adapter:
            return self.backend.adapter_versions.get(self.name, 0)
        return self.backend.version

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        if self.adapter:
            request.adapter = self.name
        return await self.backend.generate(request)

    async def load(self, path: Path, version: int, partial: bool = False) -> None:
        """Load what the weight store synced to ``path``: whole weights or an adapter.
        With ``partial``, whole weights are swapped under the generations in flight;
        otherwise (and always for an adapter) the engine is paused around the load."""
        from astraflow.weights.base import check_adapter, write_peft_dir
        from astraflow.weights.store import MANIFEST

        adapter = json.loads((path / MANIFEST).read_text()).get("adapter")
        if self.adapter != (adapter is not None):
            raise BaseMismatchError(
                f"{self.name} v{version} is {'a LoRA adapter' if adapter else 'a whole model'}"
                f" but this node {'serves adapters' if self.adapter else 'serves whole models'}"
                " (trainer.lora.rank differs between the trainer and this node's config)")
        if adapter is None and partial:
            self.drained = None
            await self.backend.swap_weights(str(path), version)
            return
        if adapter is not None:  # checked and laid out before the engine pauses
            model_path = self.backend.model_path
            await asyncio.to_thread(check_adapter, adapter, model_path, self.name, version)
            await asyncio.to_thread(write_peft_dir, path, adapter)
        started = time.perf_counter()
        await self.backend.pause()
        self.drained = time.perf_counter() - started
        try:
            if adapter is None:
                await self.backend.load_weights(str(path), version)
            else:
                await self.backend.load_adapter(self.name, str(path), version)
        finally:
            await self.backend.resume()


async def start_engines(settings: NodeSettings, policies: list[str],
                        engines: list[RolloutBackend], train: bool = True
                        ) -> dict[str, ServedPolicy]:
    """Start the engines that serve ``policies`` (appended to ``engines`` as they start,
    so a failure can shut down what started): one per policy, or in a LoRA run one for
    all, each policy an adapter of ``model_path``. ``train``: what they generate is
    trained on (an evaluator's is not: it records no routing for router replay)."""
    entry = get_registry().get("rollout_backend", settings.raas.name)
    rank, model_path = settings.lora_rank, settings.model_path
    # the trainer replays the engine's routing: every generation carries it
    replay = train and settings.router_replay
    if rank:
        engine = entry.create(settings.raas, model_path)
        if replay:
            engine.record_routing()
        engine.configure_adapters(rank, policies)
        engines.append(engine)
        await engine.start()
        log.info("serving %s as rank-%d LoRA adapters of one %s engine over %s",
                 ", ".join(policies), rank, settings.raas.name, model_path)
        return {p: ServedPolicy(p, engine, adapter=True) for p in policies}
    served = {}
    for policy in policies:
        engine = entry.create(settings.raas, model_path)
        if replay:
            engine.record_routing()
        engines.append(engine)
        await engine.start()
        served[policy] = ServedPolicy(policy, engine, adapter=False)
    return served


def sampling_defaults(workflow: Any) -> dict[str, Any]:
    """What a request that names neither gets: the workflow's ``max_new_tokens`` and
    ``temperature``, else :class:`~astraflow.workflows.builder.WorkflowConfig`'s."""
    from astraflow.workflows.builder import WorkflowConfig, with_defaults

    sampling = with_defaults(workflow or {}, WorkflowConfig)
    return {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature}


class EnginePolicy:
    """A policy handle for workflows: token-level generation on this node's engine;
    ``defaults`` (:func:`sampling_defaults`) for what a request does not name."""

    def __init__(self, name: str, backend: ServedPolicy, defaults: dict[str, Any]) -> None:
        self.name = name
        self.backend = backend
        self.defaults = sampling_defaults(defaults)  # what it lacks: the base's

    async def generate(self, prompt_ids: list[int], *, n: int = 1,
                       max_new_tokens: int | None = None, temperature: float | None = None,
                       stop_token_ids: list[int] | None = None, top_p: float = 1.0,
                       seed: int | None = None) -> list[Generation]:
        request = GenerationRequest(
            prompt_ids=list(prompt_ids), n=n,
            max_new_tokens=max_new_tokens or self.defaults["max_new_tokens"],
            temperature=self.defaults["temperature"] if temperature is None else temperature,
            stop_token_ids=list(stop_token_ids or []), top_p=top_p, seed=seed,
        )
        return await self.backend.generate(request)
