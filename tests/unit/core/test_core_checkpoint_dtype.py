"""``raas.dtype=auto`` resolved from a checkpoint's config.json (astraflow.models.checkpoint),
as the engines and the memory estimate resolve it: torch-free, no weights read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astraflow.models.checkpoint import served_dtype


@pytest.mark.parametrize(("config", "served"), [
    ({"dtype": "bfloat16"}, "bfloat16"),  # transformers 5
    ({"torch_dtype": "bfloat16"}, "bfloat16"),  # transformers 4
    ({"torch_dtype": "torch.float16"}, "float16"),
    ({"dtype": "float32"}, "float32"),  # the tiny fixtures: as before
    ({"torch_dtype": "float32", "text_config": {"torch_dtype": "bfloat16"}}, "bfloat16"),
    ({"model_type": "qwen2"}, "float32"),  # declares none
    ({"dtype": "auto"}, "float32"),
    ({"torch_dtype": "float8_e4m3fn"}, "float32"),  # none an engine serves
])
def test_auto_is_the_dtype_the_checkpoint_declares(tmp_path: Path, config: dict,
                                                  served: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert served_dtype("auto", tmp_path) == served
    assert served_dtype("float32", tmp_path) == "float32"  # a dtype set is kept


def test_a_checkpoint_without_a_config_is_served_in_float32(tmp_path: Path) -> None:
    assert served_dtype("auto", tmp_path) == "float32"
    (tmp_path / "config.json").write_text("not json")
    assert served_dtype("auto", tmp_path) == "float32"
