"""Megatron over two gloo ranks on CPU: tensor-parallel (TP=2) and data-parallel (DP=2)
trainers train like one process.

Megatron's tensor-parallel layers run over gloo as over NCCL, so this checks the
sharded load, the gathered export, the cross-rank gradient norm and the replicas'
gradient all-reduce for real; checkpoints move between tensor-parallel sizes.
"""

from pathlib import Path

import pytest

from astraflow.testing.trainer import check_ranks_match_one_process


@pytest.mark.slow
def test_two_tensor_parallel_ranks_match_one_process(tiny_model_dir: str, tmp_path: Path) -> None:
    check_ranks_match_one_process("megatron", tiny_model_dir, tmp_path,
                                  {"world_size": 2, "tensor_model_parallel_size": 2})
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == [
        "model-tp0.safetensors", "model-tp1.safetensors", "optimizer-tp0.safetensors",
        "optimizer-tp1.safetensors", "trainer_state.json",
    ]  # fmt: skip


@pytest.mark.slow
def test_two_data_parallel_replicas_match_one_process(tiny_model_dir: str,
                                                      tmp_path: Path) -> None:
    check_ranks_match_one_process("megatron", tiny_model_dir, tmp_path, {
        "world_size": 2, "loss": "m2po", "m2po_tau": 1e-6, "micro_batch_size": 3})
