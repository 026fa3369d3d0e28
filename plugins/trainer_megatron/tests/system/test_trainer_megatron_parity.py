"""``trainer=megatron`` and ``trainer=hf`` are the same policy from the same checkpoint.

Loaded from one tiny Hugging Face checkpoint and fed one batch, both backends give
the same per-token log-probs, the same loss and metrics, and the same update; what
Megatron exports loads back into ``transformers`` with the logits Megatron computes.
"""

import math
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
from astraflow_trainer_hf import HFConfig
from astraflow_trainer_megatron import MegatronConfig
from omegaconf import OmegaConf
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from astraflow.plugins import get_registry
from astraflow.testing.trainer import arithmetic_batch
from astraflow.types import Batch


def _backends(model_dir: str, **settings: Any) -> tuple[Any, Any]:
    """Both backends with the same optimisation settings, whatever the defaults say."""
    hf_cfg = HFConfig(**settings)
    shared = {
        f.name: getattr(hf_cfg, f.name)
        for f in fields(MegatronConfig)
        if f.name != "name" and hasattr(hf_cfg, f.name)
    }
    registry = get_registry()
    hf = registry.get("trainer_backend", "hf").create(OmegaConf.structured(hf_cfg), model_dir)
    megatron = registry.get("trainer_backend", "megatron").create(
        OmegaConf.structured(MegatronConfig(**shared)), model_dir
    )
    return hf, megatron


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _off_policy(batch: Batch, logprobs: list[list[float]]) -> Batch:
    """Behaviour log-probs away from the current policy, so ratios vary and some clip."""
    for item, logp in zip(batch.items, logprobs, strict=True):
        traj = item.trajectory
        traj.logprobs = [
            lp + 0.4 * math.sin(3.0 * i) if m else 0.0
            for i, (lp, m) in enumerate(zip(logp, traj.loss_mask, strict=True))
        ]
    return batch


@pytest.mark.parametrize("loss", ["ppo", "m2po"])
def test_same_logprobs_loss_and_update_as_trainer_hf(tiny_model_dir: str, loss: str) -> None:
    hf, megatron = _backends(tiny_model_dir, loss=loss, micro_batch_size=3, kl_coef=0.05)
    batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0])

    start_hf, start_mg = hf.compute_logprobs(batch), megatron.compute_logprobs(batch)
    start_diff = _max_diff(start_hf, start_mg)
    _off_policy(batch, start_hf)
    hf.train_step(batch), megatron.train_step(batch)
    # the second step sees a policy away from its KL reference
    metrics_hf, metrics_mg = hf.train_step(batch), megatron.train_step(batch)
    after_diff = _max_diff(hf.compute_logprobs(batch), megatron.compute_logprobs(batch))
    metric_diff = max(abs(metrics_hf[k] - metrics_mg[k]) for k in metrics_hf)
    print(
        f"\n[{loss}] max |logp diff| before {start_diff:.2e}, after two steps {after_diff:.2e}; "
        f"loss {metrics_hf['loss']:.6f} vs {metrics_mg['loss']:.6f}; "
        f"max |metric diff| {metric_diff:.2e}"
    )

    assert start_diff < 1e-5
    assert metrics_hf.keys() == metrics_mg.keys()
    assert metrics_hf["clip_fraction"] > 0 and metrics_hf["kl"] > 0  # the test exercises both
    for key, value in metrics_hf.items():
        assert metrics_mg[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert after_diff < 1e-3


@pytest.mark.parametrize("export_dtype, atol", [("float32", 1e-4), ("bfloat16", 0.1)])
def test_exported_version_loads_in_transformers_with_megatrons_logits(
    tiny_model_dir: str, tmp_path: Path, export_dtype: str, atol: float
) -> None:
    _, megatron = _backends(tiny_model_dir, export_dtype=export_dtype)
    batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5, -0.5])
    _off_policy(batch, megatron.compute_logprobs(batch))
    megatron.train_step(batch)

    save_file(megatron.export_weights(), tmp_path / "model.safetensors")
    shutil.copy(Path(tiny_model_dir) / "config.json", tmp_path / "config.json")
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, local_files_only=True
    )
    ids = torch.tensor([batch.items[0].trajectory.tokens, batch.items[1].trajectory.tokens])
    with torch.no_grad():
        expected = megatron.logits(megatron.model, ids).float()
        got = loaded(input_ids=ids).logits
    diff = float((got - expected).abs().max())
    print(f"\n[{export_dtype} export] max |logit diff| transformers vs Megatron {diff:.2e}")
    assert diff < atol

    megatron.save_pretrained(str(tmp_path / "pretrained"))
    pretrained = AutoModelForCausalLM.from_pretrained(
        tmp_path / "pretrained", local_files_only=True
    )
    assert pretrained.dtype == torch.float32  # the training dtype, as trainer=hf saves it
    with torch.no_grad():
        assert float((pretrained(input_ids=ids).logits - expected).abs().max()) < 1e-4
