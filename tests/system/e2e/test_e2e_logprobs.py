"""Behaviour log-probs from the rollout engine match the trainer's recomputation."""

from __future__ import annotations

import pytest

from astraflow.testing.rollout import logprob_gap, make_adapter

TOLERANCE = 1e-4  # both float32; KV-cached decode vs one full forward differ by rounding


def test_raas_hf_logprobs_match_trainer_hf(tiny_model_dir):
    worst, count = logprob_gap("hf", "hf", tiny_model_dir)
    print(f"max |behaviour - recomputed| log-prob over {count} tokens: {worst:.2e}")
    assert count >= 12
    assert worst < TOLERANCE


def test_raas_hf_adapter_logprobs_match_trainer_hf_with_that_adapter(tiny_model_dir, tmp_path):
    """raas=hf serves a LoRA adapter unmerged (peft); a LoRA trainer holding the same
    adapter recomputes the same log-probs. The adapter moves them far more than the
    tolerance, so an engine that ignored it would fail."""
    pytest.importorskip("peft")
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    worst, count = logprob_gap("hf", "hf", tiny_model_dir, adapter=adapter)
    print(f"max |behaviour - recomputed| log-prob with an adapter over {count} tokens: "
          f"{worst:.2e}")
    assert count >= 12
    assert worst < TOLERANCE
