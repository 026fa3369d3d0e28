"""Rollout backend over Hugging Face transformers (CPU or GPU).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting


@dataclass
class HFConfig:
    """Settings of ``raas=hf``."""

    name: str = "hf"
    #: the weights' dtype: "auto" -- the checkpoint's own, as its config.json declares
    #: it (float32 when it declares none): a bfloat16 release is held in half the memory
    dtype: str = setting("auto", choices=("auto", "float32", "bfloat16"))
    #: sequences per forward pass (after expanding n)
    max_batch_size: int = setting(256, ge=1)
    #: padded prompt tokens per forward pass (rows x the longest prompt; a prompt longer
    #: than this runs alone): a left-padded batch's attention mask grows as rows x
    #: width^2, and four 35k-token agent-harness prompts in one batch took 22 GB
    max_batch_tokens: int = setting(16384, ge=1)
    num_threads: int = setting(1, ge=1)  # torch intra-op threads of this engine
    device: str = "auto"  # auto (the first CUDA device if any, else cpu) | cpu | cuda[:N]
    #: samples of one prompt (a GRPO group) share one prefill: the prompt runs through
    #: the model once and its keys and values are copied to each sample's row
    shared_prefix: bool = True
    #: a conversation's next turn reuses its last turn's keys and values: the KV caches
    #: of generations whose prompt has at least prefix_cache_min_tokens tokens are kept,
    #: up to prefix_cache_gib in all (0: none kept), until new weights arrive
    prefix_cache_gib: float = setting(0.5, ge=0)
    prefix_cache_min_tokens: int = setting(1024, ge=1)


def check_config(config) -> None:
    """``raas=hf``'s settings judged without importing torch (the launcher's pre-flight
    and the backend both call it); ranges and choices are declared with the settings."""
    device = str(config.device)
    if device not in ("auto", "cpu", "cuda") and not (
            device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"raas.device={device!r}: choose auto, cpu, cuda or cuda:N")


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "hf",
        "astraflow_raas_hf.backend:HFRolloutBackend",
        HFConfig,
        description="Rollout backend over Hugging Face transformers (CPU or GPU).",
        check=check_config,
    )
