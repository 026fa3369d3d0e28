"""Fixtures every AstraFlow plugin's tests can use (loaded through ``pytest11``).

Heavy imports (torch, transformers) happen inside fixtures, so loading this plugin
keeps every test session that does not use them torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from astraflow.plugins import Registry, get_registry


@pytest.fixture
def astraflow_registry() -> Registry:
    """The registry of the installed plugins, rebuilt for this test."""
    return get_registry(refresh=True)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The tiny model the default run starts from (warm-started on arithmetic).

    Kept in the same cache as the launcher's models (``$ASTRAFLOW_CACHE``, else
    ``~/.cache/astraflow``): it is deterministic, and rebuilt whenever its config,
    seed or tasks change.
    """
    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.tasks.arithmetic import ArithmeticTasks

    out = _models_cache() / "test-tiny-arithmetic-seed0"
    tasks = list(ArithmeticTasks().train_tasks())
    return make_tiny_model(out, ModelConfig(), seed=0, warmstart_tasks=tasks)


@pytest.fixture(scope="session")
def chat_model_dir() -> str:
    """A Qwen2-layout checkpoint as users bring one: byte-level BPE, ChatML, a chat template,
    ``<|im_end|>`` and ``<|endoftext|>`` as stop tokens, tied embeddings, one KV head.

    Random weights, shared by the whole session and cached like ``tiny_model_dir``: copy
    it before training it in place (:func:`astraflow.testing.models.sft_warmstart`).
    """
    from astraflow.testing.models import make_chat_model

    return make_chat_model(_models_cache() / "test-chat-qwen2-seed0", arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def long_chat_model_dir() -> str:
    """``chat_model_dir``'s shape and tokenizer with a 128k-token context: agent
    harnesses' prompts (Claude Code's, Codex's) are 26-35k of its tokens (random
    weights; shared and cached as ``chat_model_dir``)."""
    from astraflow.testing.models import make_chat_model

    return make_chat_model(_models_cache() / "test-chat-qwen2-128k-seed0", arch="qwen2",
                           seed=0, context=131072)


@pytest.fixture(scope="session")
def moe_model_dir() -> str:
    """A Qwen3-MoE checkpoint (four experts, two routed to a token, in both layers) with
    ``chat_model_dir``'s tokenizer, stored as Qwen3-30B-A3B is: one matrix per expert
    (random weights; shared and cached as ``chat_model_dir``)."""
    from astraflow.testing.models import make_chat_model

    return make_chat_model(_models_cache() / "test-chat-qwen3moe-seed0", arch="qwen3_moe",
                           seed=0)


@pytest.fixture(scope="session")
def wordlevel_model_dir() -> str:
    """A Llama checkpoint with a word-level tokenizer, ``<s>``/``</s>``, no pad token and no
    chat template (random weights; shared and cached as ``chat_model_dir``)."""
    from astraflow.testing.models import make_wordlevel_llama

    return make_wordlevel_llama(_models_cache() / "test-wordlevel-llama-seed0", seed=0)


def _models_cache() -> Path:
    """Where the launcher caches its models too: ``$ASTRAFLOW_CACHE``, else ``~/.cache``."""
    cache = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))
    return cache / "models"
