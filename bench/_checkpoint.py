"""The checkpoint job of ``bench/peers.py --checkpoint``: the plain job's shape on a model
that is not the built-in tiny one.

A Llama checkpoint with its own ChatML BPE tokenizer (prompts rendered through its chat
template, ``<|im_end|>`` ending answers), the arithmetic task's problems written to JSONL
files and the reward in a Python file of the user's -- what a user bringing their own
model and data runs. Built locally (no hub), warm-started as the tiny model is (the same
supervised steps on the training answers, so RL starts from a weak policy that sometimes
answers right) and cached by seed under ``~/.cache/astraflow/models``.
"""

from __future__ import annotations

import json
from pathlib import Path

#: supervised warm-up steps (the tiny model's default) before RL starts
WARMSTART_STEPS = 400

REWARD = '''"""The arithmetic answer, exactly (the reward of the checkpoint job's runs)."""


def score(task, completion):
    return float(completion.strip() == (task.answer or "").strip())
'''


def make_checkpoint_job(cache: Path, seed: int) -> list[str]:
    """Build (or reuse) the checkpoint, its JSONL files and its reward file for ``seed``;
    the overrides that run the job on them, the same for both sides."""
    from astraflow.config import compose_config
    from astraflow.tasks.arithmetic import ArithmeticConfig, ArithmeticTasks

    source = ArithmeticTasks(ArithmeticConfig())
    train, held_out = list(source.train_tasks()), source.eval_tasks()
    root = cache / "models" / f"peers-checkpoint-llama-seed{seed}"
    model = root / "model"
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, tasks in (("train", train), ("test", held_out)):
        rows = [json.dumps({"prompt": t.prompt, "answer": t.answer}) for t in tasks]
        (data / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    (data / "reward.py").write_text(REWARD)
    if not (model / "warmstarted.json").exists():
        _build(model, seed, train)
    overrides = [f"model.path={model}", "task=jsonl",
                 f"task.train_files=[{data / 'train.jsonl'}]",
                 f"task.eval_files=[{data / 'test.jsonl'}]",
                 "reward=python", f"reward.path={data / 'reward.py'}"]
    compose_config(overrides)  # a mistake here stops the bench before any run
    return overrides


def _build(model: Path, seed: int, train: list) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from astraflow.models.tiny import _WARMSTART_BATCH, _WARMSTART_LR, supervised_steps
    from astraflow.testing.models import default_corpus, make_chat_model
    from astraflow.text import load_tokenizer

    # the tests' text and the task's own, so numbers and operators merge into tokens
    corpus = [*default_corpus(), *(f"{t.prompt}{t.answer}" for t in train)]
    make_chat_model(model, arch="llama", seed=seed, corpus=corpus)
    tokenizer = load_tokenizer(str(model))
    examples = [(tokenizer.encode_prompt(t.prompt),
                 [*tokenizer.encode(t.answer or ""), tokenizer.eos_token_id]) for t in train]
    torch.manual_seed(seed)
    weights = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    supervised_steps(weights, examples, steps=WARMSTART_STEPS, lr=_WARMSTART_LR,
                     batch=_WARMSTART_BATCH, pad_token_id=tokenizer.pad_token_id, seed=seed)
    weights.save_pretrained(model)
    (model / "warmstarted.json").write_text(json.dumps({"steps": WARMSTART_STEPS,
                                                       "seed": seed}))
