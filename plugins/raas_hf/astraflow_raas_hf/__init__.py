"""Rollout backend over Hugging Face transformers (CPU or GPU).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class HFConfig:
    """Settings of ``raas=hf``."""

    name: str = "hf"
    dtype: str = "float32"  # float32 | bfloat16
    max_batch_size: int = 256  # sequences per forward pass (after expanding n)
    num_threads: int = 1  # torch intra-op threads of this engine
    device: str = "auto"  # auto (the first CUDA device if any, else cpu) | cpu | cuda[:N]
    #: samples of one prompt (a GRPO group) share one prefill: the prompt runs through
    #: the model once and its keys and values are copied to each sample's row
    shared_prefix: bool = True


def check_config(config) -> None:
    """``raas=hf``'s settings judged without importing torch (the launcher's pre-flight
    and the backend both call it)."""
    if config.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"raas.dtype={config.dtype!r}: choose one of float32, bfloat16")
    if config.max_batch_size < 1:
        raise ValueError(f"raas.max_batch_size={config.max_batch_size} must be >= 1")
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
