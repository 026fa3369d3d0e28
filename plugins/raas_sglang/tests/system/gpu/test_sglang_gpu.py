"""raas=sglang against a real SGLang server: GPU machines only, skipped elsewhere.

Runs the shared rollout contract on ``python -m sglang.launch_server`` with the tiny
local model, then a short ``python -m astraflow +raas=sglang`` job. docs/backends.md
says how to run them on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.testing.rollout import RolloutBackendContract


def _missing() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return ("sglang is not installed (on a CUDA machine: "
                "pip install 'astraflow-plugin-raas-sglang[gpu]')")
    import torch

    return None if torch.cuda.is_available() else "no CUDA device"


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"needs SGLang and a GPU: {MISSING}")


class TestSGLangContractOnGPU(RolloutBackendContract):
    backend_name = "sglang"

    @pytest.fixture(scope="class")
    @classmethod
    def backend_config(cls):
        entry = get_registry().get("rollout_backend", "sglang")
        # a tiny model needs little of the GPU; leave the rest to whoever shares it
        return OmegaConf.merge(OmegaConf.structured(entry.config_cls),
                               {"mem_fraction_static": 0.3})


def test_a_short_run_with_sglang_completes(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+raas=sglang", "raas.mem_fraction_static=0.3",
         "steps=3", "eval_every=3", f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=1800, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary, "the run wrote an empty summary"
    assert (run_dir / "final").is_dir()
