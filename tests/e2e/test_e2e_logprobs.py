"""Behaviour log-probs from the rollout engine match the trainer's recomputation."""

from __future__ import annotations

from omegaconf import OmegaConf

from astraflow.models.tiny import load_tokenizer
from astraflow.plugins import get_registry
from astraflow.testing.engine import LoopThread
from astraflow.types import Batch, GenerationRequest, TrainItem
from astraflow.workflows.builder import TrajectoryBuilder

TOLERANCE = 1e-4  # both float32; KV-cached decode vs one full forward differ by rounding


def test_raas_hf_logprobs_match_trainer_hf(tiny_model_dir):
    registry = get_registry()
    tok = load_tokenizer(tiny_model_dir)
    raas = registry.get("rollout_backend", "hf")
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
    worst = 0.0
    for item, lps in zip(items, recomputed, strict=True):
        traj = item.trajectory
        for behaviour, trained, mask in zip(traj.logprobs, lps, traj.loss_mask, strict=True):
            if mask:
                worst = max(worst, abs(behaviour - trained))
    print(f"max |behaviour - recomputed| log-prob: {worst:.2e}")
    assert worst < TOLERANCE
