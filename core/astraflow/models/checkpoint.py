"""What a checkpoint's ``config.json`` says of itself, read without torch: its dtype, and
so the dtype an engine serves it in under ``raas.dtype=auto``.

The rollout engines (``raas=hf``, ``raas=vllm``) and the launcher's memory estimate all
resolve ``auto`` here, so an engine holds what the estimate counted: a checkpoint
released in bfloat16 is served in bfloat16 (2 bytes a parameter, not 4), the tiny
float32 fixtures in float32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the dtypes an engine serves a checkpoint in
SERVED_DTYPES = ("float32", "bfloat16", "float16")
#: what ``auto`` means for a checkpoint whose config names no dtype an engine serves
FALLBACK_DTYPE = "float32"
#: spellings of the served dtypes in configs (``torch.bfloat16`` in old ones)
_ALIASES = {"float": "float32", "fp32": "float32", "bf16": "bfloat16", "half": "float16",
            "fp16": "float16"}


def model_config(model_dir: str | Path) -> dict[str, Any]:
    """``model_dir``'s ``config.json``, a multimodal checkpoint's ``text_config`` laid
    over it (its keys win: the text model is what is served); {} when there is none."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def declared_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a model config declares (``dtype``, as transformers 5 writes it, or
    ``torch_dtype``), as a name of :data:`SERVED_DTYPES`; None when it declares none of
    them (no key, ``auto``, a quantized format)."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if isinstance(value, str):
            name = value.strip().lower().removeprefix("torch.")
            name = _ALIASES.get(name, name)
            if name in SERVED_DTYPES:
                return name
    return None


def served_dtype(setting: str | None, model_dir: str | Path) -> str:
    """The dtype an engine holds ``model_dir`` in for ``raas.dtype=setting``: the setting
    itself, or for ``auto`` (and unset) the checkpoint's own as its config declares it,
    float32 when it declares none."""
    if setting and setting != "auto":
        return setting
    return declared_dtype(model_config(model_dir)) or FALLBACK_DTYPE
