"""The rollout-backend contract: one inference engine inside a RaaS node."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from astraflow.types import Generation, GenerationRequest


class RolloutBackend(ABC):
    """Wraps an engine; the RaaS node runtime owns the lease/run/push/refresh loop.

    Token in, token out: prompts arrive as ids and generations leave as ids with
    per-token behaviour log-probs, so nothing is re-tokenised between rollout and
    training. ``generate`` is called concurrently by many workflows; a backend
    batches concurrent requests itself.
    """

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise on a config this backend cannot run here; nothing is started yet.

        The launcher calls it before it starts any process, so a bad option or a
        missing dependency fails at once instead of inside a child; ``__init__``
        calls it too. The default accepts everything.
        """

    #: whether the engine serves LoRA adapters (``configure_adapters``, ``load_adapter``):
    #: then one engine serves every policy of a LoRA run, one adapter each
    supports_adapters: bool = False
    #: whether those adapters may adapt a mixture-of-experts layer's experts (``peft``'s
    #: ``target_parameters`` on the fused expert tensors), not only its linear layers
    supports_expert_adapters: bool = False
    #: whether ``swap_weights`` loads new weights under generations in flight (partial
    #: rollouts); the default ``swap_weights`` waits for them to finish instead
    supports_partial_rollouts: bool = False
    #: whether the engine can record the experts each MoE layer routed every position to
    #: (``record_routing``; router replay)
    supports_router_replay: bool = False

    def __init__(self, config: Any, model_path: str) -> None:
        self.check_config(config)
        self.config = config
        self.model_path = model_path
        self.version = 0
        #: adapter name -> the version it holds (an engine serving adapters)
        self.adapter_versions: dict[str, int] = {}

    def record_routing(self) -> None:
        """Before ``start``: every :class:`~astraflow.types.Generation` carries
        ``routed_experts`` for its prompt and its tokens (``trainer.router_replay``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot record routed experts")

    def configure_adapters(self, max_rank: int, names: list[str]) -> None:
        """Before ``start``: the engine will serve LoRA adapters of rank up to
        ``max_rank``, one per name in ``names``, over the base model at ``model_path``."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve LoRA adapters")

    async def load_adapter(self, name: str, path: str, version: int) -> None:
        """Load the ``peft`` adapter in directory ``path`` (``adapter_config.json``,
        ``adapter_model.safetensors``) as ``name`` at ``version``, replacing what ``name``
        held; requests whose ``adapter`` is ``name`` use it from then on, and their
        generations carry ``version``. The base weights stay as they are: nothing is
        merged. Called between ``pause`` and ``resume``."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve LoRA adapters")

    @abstractmethod
    async def start(self) -> None:
        """Start the engine with the weights at ``model_path``."""

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> list[Generation]:
        """Return ``request.n`` samples, each with one log-prob per generated token."""

    @abstractmethod
    async def load_weights(self, path: str, version: int) -> None:
        """Load the full weights in directory ``path`` (safetensors, HF names) as ``version``.

        Called between ``pause`` and ``resume``; no request is in flight.
        """

    async def swap_weights(self, path: str, version: int) -> None:
        """Load the full weights at ``path`` as ``version`` while generations are in
        flight: each continues on the new weights from its next token, and its
        ``Generation.token_versions`` says which version sampled each token. A long
        generation then no longer holds a refresh back. The default (an engine that cannot)
        waits for them: ``pause``, ``load_weights``, ``resume``."""
        await self.pause()
        try:
            await self.load_weights(path, version)
        finally:
            await self.resume()

    async def pause(self) -> None:
        """Stop admitting new generation; return once in-flight requests finished."""

    async def resume(self) -> None:
        """Admit generation again."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine and every process it started."""
