"""Trainer backend over Megatron-core (CPU mode when CUDA is absent).

Importing this module is cheap: the implementation is imported only when selected.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow import hookimpl
from astraflow.rl.options import PolicyGradientOptions, check_policy_gradient, lora_rank


@dataclass
class MegatronConfig(PolicyGradientOptions):
    """Settings of ``trainer=megatron``: the shared optimisation and parallel settings.

    ``world_size`` ranks split into tensor-parallel groups of
    ``tensor_model_parallel_size``, ``pipeline_model_parallel_size`` stages of equal
    numbers of layers, and data-parallel replicas; on CUDA GPUs with NCCL, without CUDA
    on CPUs with gloo.
    """

    name: str = "megatron"



#: model types whose decoder layer is Megatron's local GPT layer with RMSNorm + SwiGLU
#: (Mistral's is Llama's, as long as no sliding window limits attention)
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def check_checkpoint(model_dir: str | Path) -> dict[str, Any]:
    """``config.json`` of ``model_dir``, refused (``ValueError`` naming the file and the
    key) where the Megatron model would compute differently from the checkpoint."""
    path = Path(model_dir) / "config.json"
    cfg: dict[str, Any] = json.loads(path.read_text())
    kind = cfg.get("model_type")
    if kind not in SUPPORTED:
        moe = " (mixture-of-experts: train it with trainer=hf)" if any(
            k in cfg for k in ("num_experts", "num_local_experts", "n_routed_experts")) else ""
        raise ValueError(
            f"{path}: model_type {kind!r} is not supported by trainer=megatron "
            f"(supported: {', '.join(SUPPORTED)}){moe}"
        )
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    refused = {
        "rope_type": (rope_type, "default"),
        "hidden_act": (cfg.get("hidden_act", "silu"), "silu"),
        "mlp_bias": (cfg.get("mlp_bias", False), False),
        "use_sliding_window": (cfg.get("use_sliding_window", False), False),
    }
    if kind != "qwen2":  # qwen2 always has q/k/v biases; llama and qwen3 add o_proj's too
        refused["attention_bias"] = (cfg.get("attention_bias", False), False)
    if kind == "mistral":  # a window needs a mask Megatron's local layer does not build
        refused["sliding_window"] = (cfg.get("sliding_window"), None)
    for key, (got, want) in refused.items():
        if got != want:
            raise ValueError(f"{path}: {key}={got!r} is not supported (only {want!r})")
    return cfg


def check_config(config, model_path: str | None = None) -> None:
    """``trainer=megatron``'s settings judged without importing torch or Megatron-core
    (the launcher's pre-flight and the backend both call it); with ``model_path``, the
    checkpoint too."""
    check_policy_gradient(config)
    if model_path is not None:
        check_checkpoint(model_path)
    if lora_rank(config):
        # Megatron-core has no adapter layers of its own; tensor-parallel adapters
        # would need sharded A/B matrices beside every Column/RowParallelLinear
        raise ValueError("trainer.lora.rank > 0: trainer=megatron trains whole models "
                         "only; train LoRA adapters with trainer=hf (peft)")


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "megatron",
        "astraflow_trainer_megatron.backend:MegatronTrainerBackend",
        MegatronConfig,
        description="Trainer backend over Megatron-core (CPU mode when CUDA is absent).",
        check=check_config,
    )
