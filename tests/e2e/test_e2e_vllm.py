"""raas=vllm end to end: its behaviour log-probs match the HF trainer's, and a run learns.

Each test starts real vLLM engines on CPU (tens of seconds each), so they are few.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

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


@pytest.mark.slow
def test_a_run_on_vllm_trains_and_evaluates(tmp_path, tiny_model_dir):
    """`python -m astraflow +raas=vllm`: the node and the evaluator both serve on vLLM."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+raas=vllm", "+experiment=smoke",
         f"run_dir={run_dir}", f"model.path={tiny_model_dir}", "launcher.progress=false"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert OmegaConf.load(run_dir / "config.yaml").raas.name == "vllm"
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    assert summary["steps"] == 3
    assert summary["trajectories_trained"] == 3 * 8
    assert summary["final_eval_accuracy"] is not None
    evals = [json.loads(line) for line in (run_dir / "metrics" / "eval-policy.jsonl").open()]
    # the evaluator's engine scored the start weights and, reloaded in place, the final ones
    assert [e["version"] for e in evals] == [0, 3]
