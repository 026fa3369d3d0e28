"""raas=vllm end to end: its behaviour log-probs match the HF trainer's, and a run learns.

Each test starts real vLLM engines on CPU (tens of seconds each), so they are few.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from astraflow.models.tiny import load_tokenizer
from astraflow.plugins import get_registry
from astraflow.testing.engine import LoopThread
from astraflow.types import Batch, GenerationRequest, TrainItem
from astraflow.workflows.builder import TrajectoryBuilder

pytest.importorskip("vllm")

# Both sides compute in float32; vLLM's CPU attention and fused kernels sum in another
# order than the trainer's eager forward, which moves log-probs by ~1e-5.
TOLERANCE = 1e-4


@pytest.mark.slow
def test_raas_vllm_logprobs_match_trainer_hf(tiny_model_dir):
    registry = get_registry()
    tok = load_tokenizer(tiny_model_dir)
    raas = registry.get("rollout_backend", "vllm")
    engine = raas.create(OmegaConf.structured(raas.config_cls), tiny_model_dir)
    loop = LoopThread()
    loop.run(engine.start())
    try:
        items = []
        for text in ("12+7=", "3-15=", "20+20="):
            prompt = tok.encode(text)
            gens = loop.run(engine.generate(GenerationRequest(prompt, max_new_tokens=8, n=4)))
            for gen in gens:
                builder = TrajectoryBuilder(text, text)
                builder.add_context(prompt)
                builder.add_generation("policy", gen)
                items.append(TrainItem(builder.build("policy", 0.0), 0.0))
    finally:
        loop.run(engine.shutdown())
        loop.close()
    trainer = registry.get("trainer_backend", "hf")
    backend = trainer.create(OmegaConf.structured(trainer.config_cls), tiny_model_dir)
    recomputed = backend.compute_logprobs(Batch("b", "policy", items))
    worst, count = 0.0, 0
    for item, lps in zip(items, recomputed, strict=True):
        traj = item.trajectory
        for behaviour, trained, mask in zip(traj.logprobs, lps, traj.loss_mask, strict=True):
            if mask:
                worst, count = max(worst, abs(behaviour - trained)), count + 1
    print(f"max |vllm behaviour - hf recomputed| log-prob over {count} tokens: {worst:.2e}")
    assert count >= len(items)
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
