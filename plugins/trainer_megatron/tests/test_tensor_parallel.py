"""Tensor parallelism on CPU: two gloo ranks under torchrun train like one process.

Megatron's tensor-parallel layers run over gloo as over NCCL, so this checks the
sharded load, the gathered export and the cross-rank gradient norm for real.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from astraflow_trainer_megatron import MegatronConfig
from omegaconf import OmegaConf
from safetensors.torch import load_file

from astraflow.plugins import get_registry
from astraflow.testing.trainer import arithmetic_batch, with_behaviour_logprobs

WORKER = Path(__file__).with_name("tp_worker.py")
ADVANTAGES = [1.0, -1.0, 0.5, -2.0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_two_tensor_parallel_ranks_match_one_process(tiny_model_dir: str, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(WORKER),
        tiny_model_dir,
        str(tmp_path),
        "2",
        json.dumps(ADVANTAGES),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads((tmp_path / "result.json").read_text())
    assert sharded["checkpoint_resumes_bit_exactly"]
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == [
        "model-tp0.safetensors", "model-tp1.safetensors", "optimizer-tp0.safetensors",
        "optimizer-tp1.safetensors", "trainer_state.json",
    ]  # fmt: skip

    entry = get_registry().get("trainer_backend", "megatron")
    single = entry.create(OmegaConf.structured(MegatronConfig()), tiny_model_dir)
    batch = with_behaviour_logprobs(single, arithmetic_batch(tiny_model_dir, ADVANTAGES))
    metrics = single.train_step(batch)

    assert sharded["metrics"].keys() == metrics.keys()
    for key, value in metrics.items():
        assert sharded["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    got = torch.tensor([x for row in sharded["logprobs"] for x in row])
    want = torch.tensor([x for row in single.compute_logprobs(batch) for x in row])
    assert (got - want).abs().max() < 1e-4
    exported = load_file(tmp_path / "exported.safetensors")
    reference = single.export_weights()
    assert exported.keys() == reference.keys()
    for name, tensor in reference.items():  # bf16 exports: at most one rounding step apart
        torch.testing.assert_close(exported[name], tensor, rtol=1e-2, atol=1e-4)
