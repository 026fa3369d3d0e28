"""tinker-cookbook's RL recipe, unchanged, against ``astraflow tinker``: its reward rises.

The recipe is ``tinker_cookbook.recipes.math_rl.train`` with its arithmetic environment
(``What is x + y?`` after one worked example, the ``role_colon`` renderer, reward =
correct answer + 0.1 x (format - 1), where format is ending the answer with the
renderer's stop sequence). The tiny chat model cannot add two-digit numbers (a thousand
supervised steps leave it at none right), so what RL can raise here is the format term:
the model is warm-started for a few steps on the recipe's own rendering, to end about
half of its answers in format, and the recipe's own loop does the rest through the server.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from astraflow_tinker.testing import tinker_server
from tinker_cookbook import renderers
from tinker_cookbook.tokenizer_utils import get_tokenizer

from astraflow.testing.models import sft_warmstart

KEY = "tml-cookbook-user-0123"
FEWSHOT = [{"role": "user", "content": "What is 4 + 5?"}, {"role": "assistant", "content": "9"}]


def warm_started(chat_model_dir: str, out: Path, steps: int = 20) -> str:
    """A copy of the chat model after ``steps`` supervised steps on the recipe's own
    prompts and answers, as the ``role_colon`` renderer writes them."""
    shutil.copytree(chat_model_dir, out)
    renderer = renderers.get_renderer("role_colon", tokenizer=get_tokenizer(str(out)))
    rng = random.Random(0)
    examples = []
    for _ in range(512):
        x, y = rng.randint(0, 100), rng.randint(0, 100)
        messages = [*FEWSHOT, {"role": "user", "content": f"What is {x} + {y}?"}]
        prompt = renderer.build_generation_prompt(messages).to_ints()
        full = renderer.build_supervised_example(
            [*messages, {"role": "assistant", "content": str(x + y)}])[0].to_ints()
        examples.append((prompt, full[len(prompt):]))
    sft_warmstart(out, examples, steps=steps, lr=3e-3, batch=32)
    return str(out)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cookbook_rl_recipe_raises_the_tiny_models_reward(chat_model_dir, tmp_path):
    model = warm_started(chat_model_dir, tmp_path / "model")
    log = tmp_path / "recipe"
    with tinker_server(model, tmp_path / "state", [KEY]) as (url, _):
        env = {**os.environ, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0",
               "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        # the recipe's own command line; the model's name is its directory (the cookbook
        # loads a local tokenizer from it), the server serves it under that name
        done = subprocess.run(
            [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
             f"model_name={model}", "renderer_name=role_colon", "env=arithmetic",
             "group_size=8", "groups_per_batch=8", "max_tokens=16", "max_steps=50",
             "learning_rate=3e-3", "lora_rank=8", "loss_fn=importance_sampling",
             f"base_url={url}", f"log_path={log}", "eval_every=0", "save_every=0",
             "behavior_if_log_dir_exists=delete"],
            env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    reward = [s["env/all/reward/total"] for s in steps if "env/all/reward/total" in s]
    assert len(reward) == 50
    first, last = sum(reward[:10]) / 10, sum(reward[-10:]) / 10
    # a tenth of (format - 1) is the reward: +0.010 is 10 points more answers in format.
    # Warm-started 20 steps, about half end in format at first: trained, +0.012, +0.021,
    # +0.025 and +0.026 in four runs (AMD EPYC; the +0.012 in a loaded suite, which the bar
    # of +0.012 failed); learning_rate=1e-9: +0.004. A step's reward varies by ~0.006, the
    # difference of two 10-step means by ~0.003: the bar is the untrained drift plus twice
    # that. (25 steps left too little room: +0.007 to +0.015; 70 steps +0.028, 16 groups a
    # step +0.021, learning_rate=6e-3 +0.019: no steadier for their cost)
    assert last > first + 0.010, reward
    # the recipe saved its final state and sampler weights through the server
    checkpoints = [json.loads(line) for line in
                   (log / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[-1]["state_path"].startswith("tinker://")


def hub_cache(chat_model_dir: str, root: Path, repo: str) -> Path:
    """An offline Hugging Face cache (``HF_HOME``) in which ``repo`` is the chat model's
    tokenizer: the recipes ask for tokenizers by hub name, and nothing is downloaded."""
    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in Path(chat_model_dir).iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy(file, snapshot / file.name)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    return root


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cookbook_supervised_recipe_lowers_the_loss(chat_model_dir, tmp_path):
    """``recipes.sl_basic`` on the conversations file the cookbook ships, for a model the
    cookbook knows by name (Llama 3.2 1B, whose tokenizer it asks the hub for): the
    server serves the tiny model under that name, an offline cache holds its tokenizer."""
    import tinker_cookbook

    name = "meta-llama/Llama-3.2-1B"
    hf_home = hub_cache(chat_model_dir, tmp_path / "hf",
                        "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer")
    conversations = Path(tinker_cookbook.__file__).parent / "example_data/conversations.jsonl"
    log = tmp_path / "recipe"
    with tinker_server(chat_model_dir, tmp_path / "state", [KEY], name=name) as (url, _):
        env = {**os.environ, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0",
               "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        common = "dataset_builder.common_config"
        done = subprocess.run(
            [sys.executable, "-m", "tinker_cookbook.recipes.sl_basic", f"model_name={name}",
             "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
             f"dataset_builder.file_path={conversations}",
             f"{common}.model_name_for_tokenizer={name}", f"{common}.renderer_name=role_colon",
             f"{common}.max_length=256", f"{common}.batch_size=8", "max_steps=8",
             "save_every=0", "eval_every=0", "lora_rank=8", "learning_rate=1e-2",
             f"base_url={url}", f"log_path={log}"],
            env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    nll = [json.loads(line)["train_mean_nll"]
           for line in (log / "metrics.jsonl").read_text().splitlines()
           if "train_mean_nll" in line]
    assert len(nll) == 8
    # each step a new batch of conversations: 5.98, 5.80 at first, 5.59, 5.55, 5.47 last
    assert sum(nll[-3:]) / 3 < sum(nll[:2]) / 2 - 0.15, nll
