"""Trainer backend over Megatron-core (CPU mode when CUDA is absent).

Importing this module is cheap: the implementation is imported only when selected.
"""

import contextlib
import json
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow import hookimpl
from astraflow.rl.options import (
    PolicyGradientOptions,
    check_policy_gradient,
    lora_rank,
    parallel_sizes,
)
from astraflow.schema import setting


@contextlib.contextmanager
def importing_megatron() -> Iterator[None]:
    """Around the first import of Megatron-core: without the warnings that its optional
    accelerators (Transformer Engine, Apex) are missing, since it falls back to torch,
    and without W&B unless something imported it already. Megatron imports ``wandb``
    only for its inference metrics and timers' writers, which the trainer uses neither
    of, and that import was about 3 of the 8.5 CPU-seconds importing the backend took in
    every rank of every trainer. ``import wandb`` works as usual afterwards (a W&B
    logger)."""
    hide = "wandb" not in sys.modules
    if hide:
        sys.modules["wandb"] = None  # type: ignore[assignment]  # ImportError inside
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore",
                                    message=r".*(Apex|Transformer Engine).* not installed")
            yield
    finally:
        if hide and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]


@dataclass
class MegatronConfig(PolicyGradientOptions):
    """Settings of ``trainer=megatron``: the shared optimisation and parallel settings.

    ``world_size`` ranks split into tensor-parallel groups of
    ``tensor_model_parallel_size``, ``pipeline_model_parallel_size`` stages of equal
    numbers of layers, and data-parallel replicas; on CUDA GPUs with NCCL, without CUDA
    on CPUs with gloo. A mixture-of-experts model's experts are split over
    ``expert_model_parallel_size`` of the replicas (each holds its share of every MoE
    layer's experts; tokens reach them by all-gather).
    """

    expert_model_parallel_size: int = setting(1, ge=1)

    name: str = "megatron"



#: model types whose decoder layer is Megatron's local GPT layer with RMSNorm + SwiGLU
#: (Mistral's is Llama's, as long as no sliding window limits attention), with a
#: mixture-of-experts layer of SwiGLU experts in place of the MLP for the last two
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral")
MOE = ("qwen3_moe", "mixtral")


def num_experts(cfg: dict[str, Any]) -> int:
    """The routed experts of a mixture-of-experts ``config.json`` (0: a dense model)."""
    return int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)


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
    if kind in ("mistral", "mixtral"):  # a window needs a mask Megatron's layer lacks
        refused["sliding_window"] = (cfg.get("sliding_window"), None)
    if kind == "qwen3_moe":  # every layer routed: Megatron's layers are all MoE or none
        refused["decoder_sparse_step"] = (cfg.get("decoder_sparse_step", 1), 1)
        refused["mlp_only_layers"] = (cfg.get("mlp_only_layers") or [], [])
    if kind == "mixtral":  # noise on the router's logits while training
        refused["router_jitter_noise"] = (cfg.get("router_jitter_noise") or 0.0, 0.0)
    for key, (got, want) in refused.items():
        if got != want:
            raise ValueError(f"{path}: {key}={got!r} is not supported (only {want!r})")
    return cfg


def check_config(config, model_path: str | None = None) -> None:
    """``trainer=megatron``'s settings judged without importing torch or Megatron-core
    (the launcher's pre-flight and the backend both call it); with ``model_path``, the
    checkpoint too."""
    check_policy_gradient(config)
    experts = None
    if model_path is not None:
        experts = num_experts(check_checkpoint(model_path))
    ep = int(getattr(config, "expert_model_parallel_size", 1) or 1)
    dp, tp, _ = parallel_sizes(config)
    if experts and tp > 1:
        raise ValueError(f"trainer.tensor_model_parallel_size={tp} with the mixture-of-"
                         f"experts model {model_path}: Megatron splits experts over tensor-"
                         "parallel ranks only with sequence parallelism, which trainer="
                         "megatron does not run; split them with expert_model_parallel_size")
    if ep > 1:
        if experts == 0:
            raise ValueError(f"trainer.expert_model_parallel_size={ep}: {model_path} is a "
                             "dense model (no experts to split)")
        if dp % ep:
            raise ValueError(f"trainer.expert_model_parallel_size={ep} does not divide the "
                             f"{dp} data-parallel replicas (the ranks experts are split over)")
        if experts and experts % ep:
            raise ValueError(f"trainer.expert_model_parallel_size={ep} does not divide the "
                             f"{experts} experts of {model_path}")
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
