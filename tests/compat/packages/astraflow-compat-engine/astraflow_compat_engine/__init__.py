"""``raas=compat_engine``: samples from a Hugging Face checkpoint with ``transformers`` on
the CPU, one request at a time. The engine is imported only when a run selects it."""

import importlib.util
from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting


@dataclass
class EngineConfig:
    """Settings of ``raas=compat_engine``."""

    name: str = "compat_engine"
    #: torch's intra-op threads
    num_threads: int = setting(1, ge=1)


def check_config(config) -> None:
    """Before anything starts, without importing torch: its libraries are there."""
    for module in ("torch", "transformers", "safetensors"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"raas=compat_engine needs {module}: pip install {module}")


@hookimpl
def astraflow_register_rollout_backends(register):
    register("compat_engine", "astraflow_compat_engine.engine:CompatEngine", EngineConfig,
             description="transformers sampling on the CPU, one request at a time.",
             check=check_config)
