"""Fixtures every AstraFlow plugin's tests can use (loaded through ``pytest11``).

Heavy imports (torch, transformers) happen inside fixtures, so loading this plugin
keeps every test session that does not use them torch-free.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.plugins import Registry, get_registry


@pytest.fixture
def astraflow_registry() -> Registry:
    """The registry of the installed plugins, rebuilt for this test."""
    return get_registry(refresh=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model the default run starts from (warm-started on arithmetic), made once."""
    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.tasks.arithmetic import ArithmeticTasks

    out = Path(tmp_path_factory.mktemp("tiny")) / "model"
    tasks = list(ArithmeticTasks().train_tasks())
    return make_tiny_model(out, ModelConfig(), seed=0, warmstart_tasks=tasks)
