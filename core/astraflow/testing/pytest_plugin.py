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

    cache = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))
    out = cache / "models" / "test-tiny-arithmetic-seed0"
    tasks = list(ArithmeticTasks().train_tasks())
    return make_tiny_model(out, ModelConfig(), seed=0, warmstart_tasks=tasks)
