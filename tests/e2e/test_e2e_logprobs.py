"""Behaviour log-probs from the rollout engine match the trainer's recomputation."""

from __future__ import annotations

from astraflow.testing.rollout import logprob_gap

TOLERANCE = 1e-4  # both float32; KV-cached decode vs one full forward differ by rounding


def test_raas_hf_logprobs_match_trainer_hf(tiny_model_dir):
    worst, count = logprob_gap("hf", "hf", tiny_model_dir)
    print(f"max |behaviour - recomputed| log-prob over {count} tokens: {worst:.2e}")
    assert count >= 12
    assert worst < TOLERANCE
