import pytest

from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed(
        "trainer_megatron", "astraflow-plugin-trainer-megatron", "trainer", "megatron"
    )


def test_megatron_is_imported_without_wandb_and_wandb_imports_after(monkeypatch, tmp_path):
    """Megatron imports W&B for nothing the trainer uses (a third of its import time in
    every rank): hidden while Megatron imports, importable as usual after, and left
    alone where something imported it first. (A stand-in ``wandb`` package first on the
    path: the real one takes seconds to import.)"""
    import importlib
    import sys

    from astraflow_trainer_megatron import importing_megatron

    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    with importing_megatron(), pytest.raises(ImportError):
        importlib.import_module("wandb")
    loaded = importlib.import_module("wandb")
    assert loaded.__file__ == str(tmp_path / "wandb" / "__init__.py")
    with importing_megatron():
        assert importlib.import_module("wandb") is loaded
