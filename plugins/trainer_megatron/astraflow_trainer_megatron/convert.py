"""Hugging Face Llama/Qwen/Mistral checkpoints <-> Megatron-core ``GPTModel`` parameters.

The two layouts hold the same numbers under different names, except for two fused
tensors: Megatron keeps q, k and v in one ``linear_qkv`` grouped per KV head (each
group is that group's query heads, then its key head, then its value head) and the
SwiGLU gate and up projections in one ``linear_fc1`` (gate first). Both RoPE
conventions rotate halves, so no permutation of q or k is needed.

A mixture-of-experts layer (Qwen3-MoE, Mixtral) is a router (``mlp.router``, the
checkpoint's ``gate``) and one ``linear_fc1``/``linear_fc2`` pair per expert
(``mlp.experts.local_experts.<e>``, numbered over the whole model here).

Tensor parallelism splits the fused tensors by whole KV groups and by gate/up halves,
so :func:`shard` and :func:`unshard` know the same structure. Only torch is imported
here: converting needs no Megatron.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from astraflow_trainer_megatron import check_checkpoint, num_experts


@dataclass(frozen=True)
class Architecture:
    """What a Megatron ``TransformerConfig`` needs from a Hugging Face ``config.json``."""

    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    #: routed experts per layer (0: a dense model), experts per token, an expert's width
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    #: the top-k experts' weights are the softmax over all experts' scores, not
    #: renormalised over the k (Qwen3-MoE's ``norm_topk_prob=false``)
    moe_pre_softmax: bool = False
    #: the checkpoint's names of an MoE layer and of one expert's gate, up and down
    moe_module: str = "mlp"
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    @classmethod
    def from_hf(cls, model_dir: str | Path) -> Architecture:
        """Read ``config.json``; refuse what the Megatron model would compute differently."""
        cfg = check_checkpoint(model_dir)
        kind = cfg["model_type"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        heads = cfg["num_attention_heads"]
        experts = num_experts(cfg)
        moe: dict[str, Any] = {}
        if experts:
            moe = {"num_experts": experts, "moe_topk": int(cfg["num_experts_per_tok"]),
                   "moe_ffn_hidden_size": int(cfg.get("moe_intermediate_size")
                                              or cfg["intermediate_size"])}
        if kind == "qwen3_moe":
            moe["moe_pre_softmax"] = not cfg.get("norm_topk_prob", False)
        if kind == "mixtral":
            moe.update(moe_module="block_sparse_moe", expert_projections=("w1", "w3", "w2"))
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            ffn_hidden_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_positions=cfg["max_position_embeddings"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=kind == "qwen2",
            qk_norm=kind in ("qwen3", "qwen3_moe"),
            **moe,
        )


def read_hf_weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint, single-file or sharded."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (root / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{root} holds no model.safetensors (nor a sharded index)")
    out: dict[str, torch.Tensor] = {}
    for name in files:
        out.update(load_file(str(root / name)))
    return out


_RENAMES = (  # (megatron layer suffix, hugging face layer suffix)
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"),
    ("self_attention.linear_proj.weight", "self_attn.o_proj.weight"),
)
_DENSE_FC2 = (("mlp.linear_fc2.weight", "mlp.down_proj.weight"),)


def _renames(arch: Architecture) -> tuple[tuple[str, str], ...]:
    """(megatron, hugging face) layer suffixes of the tensors that only change names."""
    renames = _RENAMES + (_QK_NORMS if arch.qk_norm else ())
    if not arch.num_experts:
        return renames + _DENSE_FC2
    down, moe = arch.expert_projections[2], arch.moe_module
    experts = [(f"mlp.experts.local_experts.{e}.linear_fc2.weight",
                f"{moe}.experts.{e}.{down}.weight") for e in range(arch.num_experts)]
    return (*renames, ("mlp.router.weight", f"{moe}.gate.weight"), *experts)


def _fc1(arch: Architecture) -> list[tuple[str, str, str]]:
    """(megatron ``linear_fc1``, hugging face gate, hugging face up) layer suffixes."""
    if not arch.num_experts:
        return [("mlp.linear_fc1.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight")]
    gate, up, _ = arch.expert_projections
    moe = arch.moe_module
    return [(f"mlp.experts.local_experts.{e}.linear_fc1.weight",
             f"{moe}.experts.{e}.{gate}.weight", f"{moe}.experts.{e}.{up}.weight")
            for e in range(arch.num_experts)]
_QK_NORMS = (
    ("self_attention.q_layernorm.weight", "self_attn.q_norm.weight"),
    ("self_attention.k_layernorm.weight", "self_attn.k_norm.weight"),
)


def _qkv_split(arch: Architecture) -> list[int]:
    per_group = arch.num_heads // arch.num_kv_heads
    return [per_group * arch.head_dim, arch.head_dim, arch.head_dim]


def _fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Architecture
) -> torch.Tensor:
    sizes = zip((q, k, v), _qkv_split(arch), strict=True)
    parts = [t.reshape(arch.num_kv_heads, n, *t.shape[1:]) for t, n in sizes]
    return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])


def _split_qkv(qkv: torch.Tensor, arch: Architecture) -> tuple[torch.Tensor, ...]:
    grouped = qkv.reshape(arch.num_kv_heads, -1, *qkv.shape[1:])
    return tuple(
        part.reshape(-1, *qkv.shape[1:]) for part in grouped.split(_qkv_split(arch), dim=1)
    )


def padded_vocab_size(vocab_size: int, tensor_parallel: int) -> int:
    """Megatron splits the vocabulary evenly across tensor-parallel ranks."""
    return -(-vocab_size // tensor_parallel) * tensor_parallel


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, 0, 0, rows - tensor.shape[0]))


def hf_to_megatron(
    hf: dict[str, torch.Tensor], arch: Architecture, vocab_rows: int | None = None
) -> dict[str, torch.Tensor]:
    """Hugging Face tensors -> the full (unsharded) ``GPTModel`` state dict.

    ``vocab_rows`` pads the embedding and output layer with zero rows (see
    :func:`padded_vocab_size`); their logits must be cut off before any softmax.
    """
    rows = vocab_rows or arch.vocab_size
    out = {
        "embedding.word_embeddings.weight": pad_rows(hf["model.embed_tokens.weight"], rows),
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    if not arch.tied:
        out["output_layer.weight"] = pad_rows(hf["lm_head.weight"], rows)
    for i in range(arch.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update({dst + m: hf[src + h] for m, h in _renames(arch)})
        for fc1, gate, up in _fc1(arch):
            out[dst + fc1] = torch.cat([hf[src + gate], hf[src + up]])
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            q, k, v = (hf[f"{src}self_attn.{p}_proj.{kind}"] for p in "qkv")
            out[f"{dst}self_attention.linear_qkv.{kind}"] = _fuse_qkv(q, k, v, arch)
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], arch: Architecture) -> dict[str, torch.Tensor]:
    """The full ``GPTModel`` state dict -> Hugging Face tensors (views where possible).

    Vocabulary padding is dropped. A tied model gets ``lm_head.weight`` too, as
    ``transformers`` lists it in its state dict.
    """
    vocab = arch.vocab_size
    embed = mg["embedding.word_embeddings.weight"][:vocab]
    out = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": mg["decoder.final_layernorm.weight"],
        "lm_head.weight": embed if arch.tied else mg["output_layer.weight"][:vocab],
    }
    for i in range(arch.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out.update({dst + h: mg[src + m] for m, h in _renames(arch)})
        for fc1, gate, up in _fc1(arch):
            out[dst + gate], out[dst + up] = mg[src + fc1].chunk(2)
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            qkv = _split_qkv(mg[f"{src}self_attention.linear_qkv.{kind}"], arch)
            for p, tensor in zip("qkv", qkv, strict=True):
                out[f"{dst}self_attn.{p}_proj.{kind}"] = tensor
    return out


def split_dim(name: str) -> int | None:
    """The dimension tensor parallelism splits a parameter along (None: replicated)."""
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1  # row-parallel: split the input features
    if name.endswith(
        (
            "word_embeddings.weight",
            "output_layer.weight",
            "linear_qkv.weight",
            "linear_qkv.bias",
            "linear_fc1.weight",
        )
    ):
        return 0  # column-parallel (and the vocab-parallel embedding): split the outputs
    return None


def shard(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s part of a full ``GPTModel`` parameter.

    ``linear_fc1`` is split gate and up separately, so each rank holds its own
    ``[gate_r; up_r]``; ``linear_qkv`` rows are whole KV groups, so contiguous chunks
    are groups.
    """
    dim = split_dim(name)
    if dim is None or size == 1:
        return tensor
    if tensor.shape[dim] % size:
        raise ValueError(
            f"{name} has {tensor.shape[dim]} rows along dim {dim}: not divisible by "
            f"tensor_model_parallel_size={size}"
        )
    if name.endswith("linear_fc1.weight"):
        gate, up = tensor.chunk(2)
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])
    return tensor.chunk(size, dim=dim)[rank]


def unshard(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The full parameter from every tensor-parallel rank's part (inverse of :func:`shard`)."""
    dim = split_dim(name)
    if dim is None or len(parts) == 1:
        return parts[0]
    if name.endswith("linear_fc1.weight"):
        halves = [p.chunk(2) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(parts, dim=dim)
