"""A transformers model's tensors under its checkpoint's names, and back.

transformers (5.x) may hold a model in memory in another layout than its checkpoint: a
mixture-of-experts layer's experts as one 3-D tensor per projection
(``mlp.experts.gate_up_proj``) where the checkpoint, vLLM, SGLang and ``from_pretrained``
have one matrix per expert (``mlp.experts.0.gate_proj.weight``), or modules renamed
(Mixtral's ``block_sparse_moe`` is ``mlp``). ``save_pretrained`` converts back; weights a
trainer publishes must too, and an engine holding the model in memory converts what it
receives on the way in. Both directions use transformers' own conversion mapping for
the model (the one ``from_pretrained`` applied), so every architecture it converts is
covered; a model it does not convert passes through unchanged.

Imported by the torch plugins only (the core stays torch-free).
"""

from __future__ import annotations

from copy import deepcopy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch



def _conversions(model: Any) -> list[Any]:
    """The transforms ``from_pretrained`` applied to ``model`` (or would have)."""
    from transformers.core_model_loading import PrefixChange

    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping
        except ImportError:  # a transformers that converts nothing
            return []
        conversions = get_model_conversion_mapping(model, add_legacy=False)
        # made from a config, not loaded: no prefix to put back or take off
        conversions = [c for c in conversions if not isinstance(c, PrefixChange)]
    return list(conversions or [])


def converts(model: Any) -> bool:
    """Whether ``model``'s tensors in memory are named or shaped unlike its checkpoint's."""
    return bool(_conversions(model))


def to_checkpoint(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (``model``'s names) under the checkpoint's names and layout."""
    if not _conversions(model):
        return state
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, state)


def to_model(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (the checkpoint's names, as a trainer publishes them) under ``model``'s
    names and layout, for ``load_state_dict``; the inverse of :func:`to_checkpoint`."""
    conversions = _conversions(model)
    if not conversions:
        return state
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    pending: dict[str, Any] = {}
    for key, tensor in sorted(state.items(), key=lambda kv: dot_natural_key(kv[0])):
        renamed, pattern = rename_source_key(key, renamings, converters)
        if pattern is not None:
            transform = pending.setdefault(renamed, deepcopy(by_pattern[pattern]))
        else:
            transform = pending.setdefault(renamed, WeightRenaming(key, renamed))
            pattern = key
        transform.add_tensor(renamed, key, pattern, tensor)
    out: dict[str, torch.Tensor] = {}
    for name, transform in pending.items():
        for target, tensor in transform.convert(name, model=model, config=model.config).items():
            out[target] = tensor[0] if isinstance(tensor, list) else tensor
    return out
