"""Trainers of two ranks (gloo on CPU) join a run through the launcher.

``trainer.world_size=2`` makes ``astraflow train`` start ``torchrun``: rank 0 talks to
the data layer and hands every batch to rank 1 as tensors. Each layout's first step
is checked against one process replaying the same batch (recorded with
``record_batches``), and the weights the nodes pulled load in ``transformers``. A rank
killed mid-run ends its trainer, which the launcher restarts from its checkpoint with
nothing lost and no batch trained twice.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import launched_runs as runs
import pytest

#: how closely a step of two ranks matches one process on the same batch: sums over
#: tokens are split between ranks, so only float32 rounding differs
REL = 1e-5
COMPARED = ("loss", "grad_norm", "logprob_abs_diff", "ratio_mean", "entropy",
            "clip_fraction", "tokens")

#: each way a run's weights come together for publishing: FSDP2 shards, tensor-parallel
#: slices and pipeline stages. Megatron's data-parallel replicas publish as one process
#: does (rank 0 holds the whole model); their gradient all-reduce is checked against one
#: process in the plugin's own tests (test_tensor_parallel.py)
LAYOUTS = {
    "hf-fsdp2": ["trainer.world_size=2"],
    "megatron-tp2": ["+trainer=megatron", "trainer.world_size=2",
                     "trainer.tensor_model_parallel_size=2"],
    "megatron-pp2": ["+trainer=megatron", "trainer.world_size=2",
                     "trainer.pipeline_model_parallel_size=2"],
}


def _one_process_step(run_dir: Path, model_dir: str) -> dict[str, float]:
    """Step 1 of the run replayed by one process of the same backend and settings."""
    from omegaconf import OmegaConf

    from astraflow.components import trainer_settings
    from astraflow.plugins import get_registry
    from astraflow.types import Batch

    cfg = OmegaConf.load(run_dir / "config.yaml")
    settings = trainer_settings(cfg, "policy")
    settings.world_size, settings.tensor_model_parallel_size = 1, 1
    settings.pipeline_model_parallel_size = 1
    first = json.loads((run_dir / "metrics" / "batches-policy.jsonl").open().readline())
    assert first.pop("step") == 1
    backend = get_registry().get("trainer_backend", settings.name).create(settings, model_dir)
    return backend.train_step(Batch.from_dict(first))


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_two_rank_trainer_joins_a_run_and_steps_like_one_process(tmp_path, tiny_model_dir,
                                                                  layout):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / layout
    launcher = runs.start_run(run_dir, tiny_model_dir, "steps=3", "eval_every=3",
                              "record_batches=true", *LAYOUTS[layout])
    with runs.reaped(launcher):
        _out, err = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, err[-3000:]
    log = (run_dir / "logs" / "trainer-policy.log").read_text()
    assert "trainer rank 1 of 2: following rank 0" in log

    ranks = runs.train_records(run_dir)[0]
    one = _one_process_step(run_dir, tiny_model_dir)
    for key in COMPARED:
        assert ranks[f"train/{key}"] == pytest.approx(one[key], rel=REL, abs=1e-7), key

    # what the nodes pulled (published by rank 0, gathered from both ranks) is a whole
    # Hugging Face state dict, and the final weights are a loadable checkpoint
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final" / "policy")
    (pulled,) = sorted((run_dir / "weights" / "node-0" / "policy").glob("v*"))[-1:]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.load_state_dict(load_file(pulled / "model.safetensors"), strict=True)
    ids = torch.tensor([[4, 5, 13, 10, 17]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, final(input_ids=ids).logits,
                              atol=0.1)  # the pull is bfloat16, the final float32


def _rank_pid(run_dir: Path, rank: int) -> list[int]:
    found = []
    for pid in runs.pids_of(" train ", f"--work-dir {run_dir} "):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b" ".join(env):
            found.append(pid)
    return found


@pytest.mark.slow
def test_killing_one_rank_restarts_the_trainer_from_its_checkpoint(tmp_path, tiny_model_dir):
    steps = 10
    run_dir = tmp_path / "kill-rank"
    launcher = runs.start_run(run_dir, tiny_model_dir, f"steps={steps}", f"eval_every={steps}",
                              "trainer.world_size=2", "trainer.collective_timeout=60")

    def step() -> int:
        recs = runs.train_records(run_dir)
        return recs[-1]["step"] if recs else 0

    with runs.reaped(launcher):
        runs.wait_for(lambda: step() >= 3, 300, "trainer step 3", launcher)
        (pid,) = runs.wait_for(lambda: _rank_pid(run_dir, 1), 30, "rank 1's process")
        killed_at = runs.train_records(run_dir)[-1]["version"]
        os.kill(pid, signal.SIGKILL)
        runs.wait_for(lambda: runs.restarts(run_dir), 120, "the trainer's restart", launcher)
        _out, err = launcher.communicate(timeout=400)
    assert launcher.returncode == 0, err[-3000:]

    assert [r["component"] for r in runs.restarts(run_dir)] == ["trainer-policy"]
    summary = json.loads((run_dir / "summary.json").read_text())["policies"]["policy"]
    assert summary["steps"] == steps
    # resumed from its checkpoint: the versions go on from where it was killed
    versions = [r["version"] for r in runs.train_records(run_dir)]
    after = versions[versions.index(killed_at) + 1:]
    assert after and min(after) > killed_at and after == sorted(after)
    ledger = runs.assert_nothing_lost_or_counted_twice(run_dir, group_size=4)
    assert ledger["consumed:policy"] >= (steps - 1) * 8
