"""LoRA helpers every component shares, torch-free.

* which modules ``trainer.lora.target_modules`` adapts, read from a checkpoint's
  safetensors headers, so a name that matches nothing stops the run before anything
  starts; a name of one expert's projection (``down_proj`` in
  ``mlp.experts.0.down_proj.weight``) adapts every expert of every MoE layer;
* the names adapters travel under: ``peft``'s own (``base_model.model.<module>.lora_A.weight``),
  which is what ``peft``, vLLM and SGLang load.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from astraflow.rl.options import ALL_LINEAR

_ADAPTER_KEY = re.compile(r"\.(lora_[AB]|lora_embedding_[AB])\.[^.]+\.")
#: one expert's projection as a checkpoint stores it: ``mlp.experts.3.down_proj.weight``
_EXPERT = re.compile(r"\.experts\.\d+\.([^.]+)\.weight$")


def tensor_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Names and shapes of a checkpoint's tensors (every shard), from headers only."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with open(file, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def linear_modules(model_dir: str | Path) -> list[str]:
    """Modules of a checkpoint with a 2-D ``weight`` that is not an embedding, nor one
    expert of a mixture-of-experts layer (stored one matrix per expert, held fused in
    memory: not a linear layer an adapter wraps)."""
    return sorted(name[: -len(".weight")] for name, shape in tensor_shapes(model_dir).items()
                  if name.endswith(".weight") and len(shape) == 2 and "embed" not in name
                  and ".experts." not in name)


def expert_projections(model_dir: str | Path) -> list[str]:
    """The projections a checkpoint's mixture-of-experts layers hold one matrix of per
    expert (``gate_proj``, ``up_proj``, ``down_proj``; Mixtral's ``w1``, ``w2``, ``w3``)."""
    return sorted({m.group(1) for name in tensor_shapes(model_dir)
                   if (m := _EXPERT.search(name))})


def expert_targets(targets: list[str] | str, model_dir: str | Path) -> list[str]:
    """The target names that adapt the experts of ``model_dir``'s MoE layers (named as
    the checkpoint names one expert's projection); ``all-linear`` adapts none."""
    if targets == ALL_LINEAR:
        return []
    projections = expert_projections(model_dir)
    return [t for t in targets if t in projections]


#: an expert's gate and up projections, which transformers holds as one tensor
#: (``experts.gate_up_proj``): adapted together or not at all
FUSED_EXPERT_PAIRS = (("gate_proj", "up_proj"), ("w1", "w3"))


def matches(module: str, target: str) -> bool:
    """peft's rule for a target name: the module's name is it or ends with ``.<it>``."""
    return module == target or module.endswith("." + target)


def check_targets(targets: list[str] | str, model_dir: str | Path) -> None:
    """Every target name adapts at least one module of the checkpoint at ``model_dir``."""
    if targets == ALL_LINEAR:
        return
    modules = linear_modules(model_dir)
    if not modules:  # no safetensors to read: the trainer checks when it loads
        return
    projections = expert_projections(model_dir)
    unmatched = [t for t in targets
                 if not any(matches(m, t) for m in modules) and t not in projections]
    if unmatched:
        kinds = sorted({m.rsplit(".", 1)[-1] for m in modules})
        experts = f", its experts' {projections}" if projections else ""
        raise ValueError(f"trainer.lora.target_modules: {unmatched} match no module of "
                         f"{model_dir}; its linear layers are {kinds}{experts} (or use "
                         f"{ALL_LINEAR!r})")
    for pair in FUSED_EXPERT_PAIRS:
        named = [t for t in pair if t in targets and t in projections]
        if len(named) == 1:
            raise ValueError(f"trainer.lora.target_modules: {named} without "
                             f"{[t for t in pair if t not in named]}: the model holds them "
                             "as one tensor (experts.gate_up_proj); adapt all or none")


def adapter_key(name: str) -> str:
    """A trained parameter's name as ``peft`` saves it: without the adapter's name."""
    return _ADAPTER_KEY.sub(lambda m: f".{m.group(1)}.", name)
