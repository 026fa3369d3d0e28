"""The trainer-backend contract: one policy's model and optimiser."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from astraflow.types import Batch


class TrainerBackend(ABC):
    """Owns model and optimiser; the trainer runtime owns pull/step/publish/ack.

    Losses and advantages come from :mod:`astraflow.rl` so every backend optimises
    the same objective.
    """

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raise on a config this backend cannot run here; nothing is started yet.

        The launcher calls it before it starts any process, so a bad option or a
        missing dependency fails at once instead of inside a child; ``__init__``
        calls it too. The default accepts everything.
        """

    def __init__(self, config: Any, model_path: str) -> None:
        self.check_config(config)
        self.config = config
        self.model_path = model_path

    @abstractmethod
    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimiser step on ``batch``; returns scalar metrics (loss, grad norm, ...)."""

    @abstractmethod
    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        """Per-token log-probs of each item's tokens under the current weights.

        Entry ``i`` of a sequence is log p(token_i | tokens_<i); entry 0 is 0.0.
        """

    @abstractmethod
    def export_weights(self) -> dict[str, Any]:
        """The current weights by Hugging Face tensor names (torch tensors); a backend
        that trains adapters exports the adapters alone, under ``peft``'s names."""

    def adapter_config(self) -> dict[str, Any] | None:
        """A LoRA backend's ``peft`` adapter config (``adapter_config.json``): its exports
        are then adapters of ``model_path``. None (the default): whole models."""
        return None

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Save model, optimiser and step so ``load_checkpoint`` resumes exactly."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what ``save_checkpoint`` wrote."""

    def save_pretrained(self, path: str) -> None:
        """Write the model in Hugging Face format (loadable by ``transformers``)."""
        raise NotImplementedError
