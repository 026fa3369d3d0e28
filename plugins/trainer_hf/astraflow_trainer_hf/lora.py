"""``trainer=hf``'s LoRA: which of a model's layers and fused expert tensors ``peft``
adapts, the adapted model's state merged back into the plain model's, and the KL
reference a LoRA trainer gets for free (its adapters switched off)."""

from __future__ import annotations

import re
from typing import Any

import torch

from astraflow.lora import matches
from astraflow.models import hf_layout


def peft_targets(model: torch.nn.Module,
                  targets: list[str] | str) -> tuple[list[str] | str, list[str]]:
    """``trainer.lora.target_modules`` as ``peft`` takes them: the names of linear
    layers, and the fused expert tensors (``experts.gate_up_proj``) that hold the expert
    projections named, as ``target_parameters``.

    A checkpoint stores one matrix per expert and projection; transformers may hold a
    layer's experts as one 3-D tensor per projection, or two projections in one
    (``gate_up_proj``): those two are adapted together or not at all.
    """
    if isinstance(targets, str):  # all-linear: linear layers alone, as peft takes it
        return targets, []
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    modules = [t for t in targets if any(matches(n, t) for n in linear)]
    parameters: list[str] = []
    seen: set[str] = set()
    for name, tensor in model.named_parameters():
        owner, _, short = name.rpartition(".")
        if tensor.dim() != 3 or not owner.endswith("experts") or short in seen:
            continue
        seen.add(short)
        held = {key.rsplit(".", 2)[-2]
                for key in hf_layout.to_checkpoint(model, {name: tensor.detach()})}
        named = held & set(targets)
        if named and named != held:
            raise ValueError(f"trainer.lora.target_modules: {sorted(named)} without "
                             f"{sorted(held - named)}: the model holds them as one tensor "
                             f"({owner.rpartition('.')[2]}.{short}); adapt all or none")
        if named:
            parameters.append(f"experts.{short}")
    return modules, parameters


def merge_lora(state: dict[str, torch.Tensor], scaling: float,
               experts: dict[str, tuple[str, int, bool]] | None = None,
               ) -> dict[str, torch.Tensor]:
    """A ``peft`` LoRA model's full state dict as the plain model's: every adapted
    weight ``W + scaling * B @ A``, under the base model's own names.

    ``experts``: the adapted fused expert tensors (``peft``'s ``target_parameters``), as
    :func:`expert_wrappers` gives them: per expert ``e``, ``W[e] + scaling * B_e @ A_e``.
    """
    experts = experts or {}
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        out = _BASE_LAYER.sub("", name.removeprefix("base_model.model."))
        if name in experts:
            wrapper, count, swapped = experts[name]
            a = state[f"{wrapper}.lora_A.default.weight"].to(tensor.dtype)
            b = state[f"{wrapper}.lora_B.default.weight"].to(tensor.dtype)
            a = a.reshape(count, -1, a.shape[-1])  # experts x rank x in
            b = b.reshape(b.shape[0], -1, count)  # out x rank x experts
            delta = torch.einsum("ore,eri->eoi" if swapped else "ore,eri->eio", b, a)
            tensor = tensor + scaling * delta
        elif ".base_layer." in name and name.endswith(".weight"):
            prefix = name.split(".base_layer.")[0]
            [a] = [v for k, v in state.items() if k.startswith(prefix + ".lora_A.")]
            [b] = [v for k, v in state.items() if k.startswith(prefix + ".lora_B.")]
            tensor = tensor + scaling * (b.to(tensor.dtype) @ a.to(tensor.dtype))
        merged[out] = tensor.detach().clone()
    return merged


#: the wrappers ``peft`` puts between a module and its weights
_BASE_LAYER = re.compile(r"\.base_layer(?=\.)")


def expert_wrappers(model: torch.nn.Module) -> dict[str, tuple[str, int, bool]]:
    """Each fused expert tensor a LoRA adapts (``target_parameters``), by its state-dict
    name: the name of the ``peft`` wrapper holding its ``lora_A``/``lora_B``, the number
    of experts, and whether the tensor is ``experts x out x in``."""
    from peft.tuners.lora.layer import ParamWrapper

    found: dict[str, tuple[str, int, bool]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, ParamWrapper):
            continue
        inner, owner = name, module
        while isinstance(owner, ParamWrapper):  # wrappers of other tensors nest
            inner, owner = f"{inner}.base_layer", owner.base_layer
        found[f"{inner}.{module.parameter_name}"] = (
            name, int(module.num_experts), bool(module._did_swap_in_out_features))
    return found


class WithoutAdapter:
    """The KL reference of a LoRA trainer: the same model with its adapters switched off."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def get_base_model(self) -> Any:
        return self.model.get_base_model()

    def __call__(self, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**kwargs)


def jsonable(value: Any) -> Any:
    return sorted(value) if isinstance(value, set | frozenset) else str(value)
