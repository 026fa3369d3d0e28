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
@pytest.mark.parametrize(("split", "files"), [
    ("tensor_model_parallel_size", ["tp0", "tp1"]),
    # one layer per stage: activations go forward and their gradients back between the
    # ranks; the published weights are gathered from both stages
    ("pipeline_model_parallel_size", ["pp0", "pp1"]),
], ids=["tp2", "pp2"])
def test_a_model_split_over_two_ranks_matches_one_process(tiny_model_dir: str, tmp_path: Path,
                                                          split: str, files: list) -> None:
    check_ranks_match_one_process("megatron", tiny_model_dir, tmp_path,
                                  {"world_size": 2, split: 2})
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == sorted(
        [f"{kind}-{f}.safetensors" for kind in ("model", "optimizer") for f in files]
        + ["trainer_state.json"])


@pytest.mark.slow
def test_two_data_parallel_replicas_match_one_process(tiny_model_dir: str,
                                                      tmp_path: Path) -> None:
    check_ranks_match_one_process("megatron", tiny_model_dir, tmp_path, {
        "world_size": 2, "loss": "m2po", "m2po_tau": 1e-6, "micro_batch_size": 3})


@pytest.mark.slow
def test_pipeline_stages_with_tied_embeddings(tmp_path: Path) -> None:
    """Qwen2 ties its output layer to its embedding: the first stage holds the one and
    the last stage the other, their gradients are summed and the norm counts them once."""
    from astraflow.testing.models import make_chat_model

    model = make_chat_model(tmp_path / "qwen2", arch="qwen2")
    check_ranks_match_one_process("megatron", model, tmp_path / "run", {
        "world_size": 2, "pipeline_model_parallel_size": 2, "loss": "m2po",
        "m2po_tau": 1e-6, "micro_batch_size": 3})


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    {"tensor_model_parallel_size": 2},  # two replicas of two tensor-parallel ranks
    {"pipeline_model_parallel_size": 2},  # two replicas of two stages
    {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
], ids=["tp2-dp2", "pp2-dp2", "tp2-pp2"])
def test_four_ranks_in_two_dimensions_match_one_process(tiny_model_dir: str, tmp_path: Path,
                                                        layout: dict) -> None:
    """Each rank is in a tensor-parallel, a pipeline and a data-parallel group at once:
    every reduction must stay in its own group (four gloo ranks on the CPU)."""
    check_ranks_match_one_process("megatron", tiny_model_dir, tmp_path,
                                  {"world_size": 4, **layout})


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    {"expert_model_parallel_size": 2},  # two experts of four on each rank
    {},  # every expert on both replicas: their gradients summed over the two
], ids=["ep2", "dp2"])
def test_a_moe_models_experts_over_two_ranks_match_one_process(moe_model_dir: str,
                                                               tmp_path: Path,
                                                               layout: dict) -> None:
    """A Qwen3-MoE checkpoint (four experts, top-2) with its experts split over two
    gloo ranks (tokens all-gathered to them) or replicated: the same steps, log-probs,
    checkpoints (one file per expert rank) and final weights as one process."""
    check_ranks_match_one_process("megatron", moe_model_dir, tmp_path,
                                  {"world_size": 2, **layout})
    if layout:
        assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == sorted(
            [f"{kind}-ep{r}.safetensors" for kind in ("model", "optimizer") for r in (0, 1)]
            + ["trainer_state.json"])
