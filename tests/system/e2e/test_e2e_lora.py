"""LoRA runs end to end: adapter-only weight streams, adapters served unmerged by one
engine per node for every policy, peft-format output, and the set-up mistakes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("peft")


def launch(run_dir: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", "trainer.lora.rank=16",
         f"run_dir={run_dir}", "launcher.progress=false", *overrides],
        capture_output=True, text=True, timeout=timeout)


def manifests(run_dir: Path, policy: str) -> list[dict]:
    folder = run_dir / "store" / "weights" / policy
    return [json.loads((v / "manifest.json").read_text()) for v in sorted(folder.glob("v*"))]


def check_adapter_run(run_dir: Path, policies: list[str], base: str) -> None:
    """Every version of every stream is an adapter naming the base; the final output is
    a peft adapter that peft loads over the base."""
    from astraflow.weights.base import base_sha256

    for policy in policies:
        published = manifests(run_dir, policy)
        assert published, policy
        for manifest in published:
            assert manifest["adapter"]["base_sha256"] == base_sha256(base)
            assert manifest["adapter"]["config"]["r"] == 16
            assert all(".lora_A." in k or ".lora_B." in k for k in manifest["tensors"])
        final = run_dir / "final" / policy
        config = json.loads((final / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA" and config["r"] == 16
        assert (final / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_two_policies_are_adapters_of_one_base_on_one_vllm_engine(tmp_path, tiny_model_dir):
    """workflow=solve_verify with LoRA on raas=vllm: the node and the evaluator each start
    one engine and serve the solver and the verifier as two adapters of it."""
    pytest.importorskip("vllm")
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "+raas=vllm", "workflow=solve_verify", f"model.path={tiny_model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]
    assert set(summary) == {"solver", "verifier"}
    for policy in summary.values():
        assert policy["steps"] == 3 and policy["final_eval_accuracy"] is not None
    check_adapter_run(run_dir, ["solver", "verifier"], tiny_model_dir)
    for log in ("raas-0.log", "eval-solver.log"):
        text = (run_dir / "logs" / log).read_text()
        assert text.count("LoRA adapters of one vllm engine") == 1, text[-2000:]


@pytest.mark.slow
def test_a_lora_run_on_hf_publishes_adapters_and_writes_the_merged_model(tmp_path,
                                                                       tiny_model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    proc = launch(run_dir, f"model.path={tiny_model_dir}", "trainer.lora.merge_final=true",
                  "trainer.lora.target_modules=[q_proj,v_proj,down_proj]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_adapter_run(run_dir, ["policy"], tiny_model_dir)
    final = run_dir / "final" / "policy"
    adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True), final)
    merged = AutoModelForCausalLM.from_pretrained(final / "merged", local_files_only=True)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        gap = (adapter(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max()
    assert gap < 1e-4


def test_a_node_refuses_an_adapter_of_another_base(tmp_path, tiny_model_dir, chat_model_dir):
    """A node whose model.path differs from the base the adapter was trained on says so
    instead of serving it."""
    from omegaconf import OmegaConf

    from astraflow.plugins import get_registry
    from astraflow.raas.engines import ServedPolicy
    from astraflow.testing.rollout import make_adapter
    from astraflow.weights.base import BaseMismatchError, base_sha256

    adapter = make_adapter(tiny_model_dir, tmp_path / "v3")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "manifest.json").write_text(json.dumps({"adapter": {
        "base_sha256": base_sha256(tiny_model_dir), "base_name": "tiny", "config": config}}))
    entry = get_registry().get("rollout_backend", "hf")
    engine = entry.create(OmegaConf.structured(entry.config_cls), chat_model_dir)
    with pytest.raises(BaseMismatchError) as info:
        asyncio.run(ServedPolicy("solver", engine, adapter=True).load(adapter, 3))
    message = str(info.value)
    assert f"solver v3 is a LoRA adapter of base model {base_sha256(tiny_model_dir)[:12]}" \
        in message
    assert f"this node serves model.path={chat_model_dir}" in message
    # whole weights where adapters are expected (or the reverse) are refused as well
    with pytest.raises(BaseMismatchError, match="is a LoRA adapter but this node serves "
                                                "whole models"):
        asyncio.run(ServedPolicy("solver", engine, adapter=False).load(adapter, 3))
