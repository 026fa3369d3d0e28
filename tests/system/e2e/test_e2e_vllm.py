"""raas=vllm's behaviour log-probs match the HF trainer's, for whole models and adapters.

A real vLLM engine on CPU takes tens of seconds to start, so one serves both here. A run on
vLLM is tested with a chat checkpoint in test_e2e_own_model.py, with LoRA adapters in
test_e2e_lora.py.
"""

from __future__ import annotations

import pytest

from astraflow.testing.rollout import logprob_gaps, make_adapter

pytest.importorskip("vllm")

# Both sides compute in float32; vLLM's CPU attention and fused kernels sum in another
# order than the trainer's eager forward, which moves log-probs by ~1e-5.
TOLERANCE = 1e-4


@pytest.mark.slow
def test_raas_vllm_logprobs_match_trainer_hf_for_the_base_and_an_adapter(tiny_model_dir,
                                                                         tmp_path):
    """One engine serves the base model, then a LoRA adapter (through a LoRARequest:
    vLLM's CPU LoRA kernels) and the base beside it, as a node serving two policies as
    adapters does before the second one's first adapter arrives; the HF trainer
    recomputes the base's log-probs, and a LoRA trainer holding the same adapter the
    adapter's. The adapter covers the output layer too, as in +experiment=lora (an
    unadapted request once took the adapter's output layer there)."""
    pytest.importorskip("peft")
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter", target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])
    gaps = logprob_gaps("vllm", "hf", tiny_model_dir, adapter=adapter, with_base=True)
    for served, (worst, count) in gaps.items():
        print(f"{served}: max |vllm behaviour - hf recomputed| log-prob over {count} "
              f"tokens: {worst:.2e}")
    assert set(gaps) == {"base", "adapter", "base beside the adapter"}
    for worst, count in gaps.values():
        assert count >= 12
        assert worst < TOLERANCE
