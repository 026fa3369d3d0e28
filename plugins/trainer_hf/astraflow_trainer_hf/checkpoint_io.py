"""``trainer=hf``'s checkpoint files: one process's written from its tensors in the
layout ``torch.distributed.checkpoint`` reads back at any world size."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

#: the one file a single process's checkpoint is, named as ``dcp.save`` names it
CHECKPOINT_FILE = "shard-00001-model-00001-of-00001.safetensors"


def save_streaming(state: dict[str, Any], out: Path) -> bool:
    """Write one process's checkpoint as ``dcp.save`` would (one safetensors file that
    ``dcp.HuggingFaceStorageReader`` reads back at any world size), but from the tensors
    themselves: ``dcp.save`` serialises the whole file in memory first, twice over (at
    0.5B parameters with fp32 AdamW, 12 GB on top of the 8 GB trained). False, having
    written nothing, when the state holds what a plain safetensors file cannot (a
    non-tensor value, a strided view): ``dcp.save`` then writes it."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    if not all(isinstance(t, torch.Tensor) and t.is_contiguous() and t.device.type == "cpu"
               for t in flat.values()):
        return False
    tensors = {name: t.detach() for name, t in flat.items()}
    sharding = {name: {"saved_offsets": [0] * t.dim()} for name, t in tensors.items()}
    save_file(tensors, str(out / CHECKPOINT_FILE),
              metadata={"DCP_SHARDING_INFO": json.dumps(sharding), "DCP_VERSION": "1.0",
                        "format": "pt"})
    return True


@contextlib.contextmanager
def single_process_quiet() -> Iterator[None]:
    """``torch.distributed.checkpoint`` warns that a single process saves alone: it should."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to (save|load)")
        yield
