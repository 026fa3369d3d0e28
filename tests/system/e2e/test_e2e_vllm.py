"""raas=vllm's behaviour log-probs match the HF trainer's, for whole models and adapters.

Each test starts a real vLLM engine on CPU (tens of seconds each), so they are few. A run
on vLLM is tested with a chat checkpoint in test_e2e_own_model.py, with LoRA adapters in
test_e2e_lora.py.
"""

from __future__ import annotations

import pytest

from astraflow.testing.rollout import logprob_gap, make_adapter

pytest.importorskip("vllm")

# Both sides compute in float32; vLLM's CPU attention and fused kernels sum in another
# order than the trainer's eager forward, which moves log-probs by ~1e-5.
TOLERANCE = 1e-4


@pytest.mark.slow
def test_raas_vllm_logprobs_match_trainer_hf(tiny_model_dir):
    worst, count = logprob_gap("vllm", "hf", tiny_model_dir)
    print(f"max |vllm behaviour - hf recomputed| log-prob over {count} tokens: {worst:.2e}")
    assert count >= 12
    assert worst < TOLERANCE


@pytest.mark.slow
def test_raas_vllm_adapter_logprobs_match_trainer_hf_with_that_adapter(tiny_model_dir,
                                                                       tmp_path):
    """vLLM serves a LoRA adapter through a LoRARequest (its CPU LoRA kernels); a LoRA
    trainer holding the same adapter recomputes the same log-probs. The adapter covers
    the output layer too, as in +experiment=lora."""
    pytest.importorskip("peft")
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter", target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])
    worst, count = logprob_gap("vllm", "hf", tiny_model_dir, adapter=adapter)
    print(f"max |vllm behaviour - hf recomputed| log-prob with an adapter over {count} "
          f"tokens: {worst:.2e}")
    assert count >= 12
    assert worst < TOLERANCE


