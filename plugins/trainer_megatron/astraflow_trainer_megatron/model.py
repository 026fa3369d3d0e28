"""The Megatron-core ``GPTModel`` a checkpoint becomes, and where its parallel pieces are.

Dense layers (Llama, Qwen2/3, Mistral) or mixture-of-experts ones (Qwen3-MoE, Mixtral)
built as ``transformers`` computes them; the helpers name this rank's place in the
tensor-, pipeline- and expert-parallel groups, and the parameters an expert-parallel
rank holds (``mlp.experts.local_experts.<e>``, numbered among its own experts).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from astraflow_trainer_megatron import importing_megatron

with importing_megatron():
    import megatron.core.transformer.moe.moe_utils as _moe_utils
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import (  # noqa: F401 (the backend's)
        get_transformer_layer_offset,
    )

    from astraflow_trainer_megatron import convert, parallel

    # the router's linear asks for Transformer Engine's GEMM by a name only bound when
    # Transformer Engine imports; without it the torch path is meant to run
    if not hasattr(_moe_utils, "te_general_gemm"):
        _moe_utils.te_general_gemm = None


def _build_model(
    arch: convert.Architecture, vocab_rows: int, dtype: torch.dtype, device: torch.device
) -> Any:
    """An uninitialised ``GPTModel`` shaped like ``arch`` (weights are loaded after)."""
    config = TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=_tp_size(),
        pipeline_model_parallel_size=_pp_size(),
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
        perform_initialization=False,
        **_moe_settings(arch),
    )
    with torch.device(device), parallel.megatron_device():
        model = GPTModel(
            config,
            get_gpt_layer_local_spec(num_experts=arch.num_experts or None,
                                     moe_grouped_gemm=False, normalization="RMSNorm",
                                     qk_layernorm=arch.qk_norm),
            vocab_size=vocab_rows,
            max_sequence_length=arch.max_positions,
            parallel_output=False,  # full-vocabulary logits on every rank
            # over pipeline stages the last stage's output layer is a tensor of its own,
            # loaded from the embedding and kept equal to it by summing their gradients
            share_embeddings_and_output_weights=arch.tied and _pp_size() == 1,
            position_embedding_type="rope",
            rotary_base=arch.rope_theta,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
        )
    return model


def _moe_settings(arch: convert.Architecture) -> dict[str, Any]:
    """A mixture-of-experts layer as ``transformers`` computes it: the top-k experts of
    the router's scores, weighted by the softmax over those k (over all experts with
    ``moe_pre_softmax``), every token kept (no capacity), no auxiliary loss (the HF
    trainer adds none either). Tokens reach the experts by all-gather: the all-to-all
    dispatcher needs CUDA streams."""
    if not arch.num_experts:
        return {}
    return {
        "num_moe_experts": arch.num_experts,
        "moe_router_topk": arch.moe_topk,
        "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
        "moe_router_pre_softmax": arch.moe_pre_softmax,
        "moe_router_score_function": "softmax",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "allgather",
        "moe_grouped_gemm": False,
        "moe_permute_fusion": False,
        "moe_router_dtype": "fp32",
        "expert_model_parallel_size": _ep_size(),
    }


def _ep_size() -> int:
    return parallel_state.get_expert_model_parallel_world_size()


def _ep_rank() -> int:
    return parallel_state.get_expert_model_parallel_rank()


def _tp_size() -> int:
    return parallel_state.get_tensor_model_parallel_world_size()


def _tp_rank() -> int:
    return parallel_state.get_tensor_model_parallel_rank()


def _pp_size() -> int:
    return parallel_state.get_pipeline_model_parallel_world_size()


def _pp_rank() -> int:
    return parallel_state.get_pipeline_model_parallel_rank()


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


def _expert(name: str) -> int | None:
    """The expert index in a parameter's name (None: not an expert's)."""
    match = _EXPERT.search(name)
    return None if match is None else int(match[1])


def _renumber_expert(name: str, index: int) -> str:
    match = _EXPERT.search(name)
    assert match is not None
    return f"{name[:match.start(1)]}{index}{name[match.end(1):]}"
