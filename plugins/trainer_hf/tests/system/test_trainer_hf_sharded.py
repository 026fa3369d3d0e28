"""``trainer=hf`` sharded with FSDP2 over two gloo ranks trains like one process."""

from pathlib import Path

import pytest

from astraflow.testing.trainer import check_ranks_match_one_process


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_process(tiny_model_dir: str, tmp_path: Path) -> None:
    check_ranks_match_one_process("hf", tiny_model_dir, tmp_path, {"world_size": 2})


@pytest.mark.slow
def test_fsdp_m2po_micro_batched_with_tied_embeddings(tmp_path: Path) -> None:
    """M2PO's bounds are the whole batch's though each rank sees half of it; replicas
    with fewer micro-batches still meet the others' collectives; tied weights are
    published once."""
    from astraflow.testing.models import make_chat_model

    model = make_chat_model(tmp_path / "qwen2", arch="qwen2")
    check_ranks_match_one_process("hf", model, tmp_path / "run", {
        "world_size": 2, "loss": "m2po", "m2po_tau": 1e-6, "micro_batch_size": 3})


@pytest.mark.slow
def test_fsdp_in_bfloat16_with_activation_checkpointing(tiny_model_dir: str,
                                                        tmp_path: Path) -> None:
    """bfloat16 compute (FSDP2's mixed precision; autocast in one process) with float32
    master weights and reductions, layers recomputed in the backward pass: the same
    steps as one process computing in bfloat16, to bfloat16's precision. FSDP2 casts the
    parameters and runs every op in bfloat16 where autocast keeps norms and softmax in
    float32, so metrics differ by up to a few percent."""
    check_ranks_match_one_process("hf", tiny_model_dir, tmp_path, {
        "world_size": 2, "mixed_precision": "bfloat16", "activation_checkpointing": True},
        rel=5e-2, logprob_atol=0.25, abs_tol=1e-2)


@pytest.mark.slow
def test_fsdp_lora_adapters_match_one_process(tiny_model_dir: str, tmp_path: Path) -> None:
    """LoRA under FSDP2: the frozen base is sharded like the rest, only the adapters get
    optimiser state, and the adapters each rank publishes are one process's."""
    check_ranks_match_one_process("hf", tiny_model_dir, tmp_path, {
        "world_size": 2, "lora": {"rank": 16}, "lr": 2e-3})


@pytest.mark.slow
def test_fsdp_micro_batches_bounded_by_tokens(tiny_model_dir: str, tmp_path: Path) -> None:
    """``micro_batch_tokens``: each replica cuts its half of the batch by tokens, the
    replicas run as many micro-batches as the one with most (the collectives meet), and
    the steps are one process's."""
    check_ranks_match_one_process("hf", tiny_model_dir, tmp_path, {
        "world_size": 2, "micro_batch_tokens": 24})
