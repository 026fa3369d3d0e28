"""How many bf16 weights does one real AdamW step leave bit-identical?

The sparse weight deltas of the weight store rest on this: RL updates under bf16
change few elements per step. Measured on the tiny model with real RL batches
(sampled at temperature 1 from the current policy on the arithmetic task, group-
normalised advantages, behaviour log-probs from the policy itself), at several
learning rates and two precisions:

- ``bf16_weights``: the trainer's own weights are bfloat16 (``trainer.dtype``);
- ``fp32_master``: float32 weights, compared as the bfloat16 snapshots the rollout
  engines load (``export_weights``) -- what a delta would carry.

Prints a table and writes ``bench/results/bf16_sparsity.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

import torch
from astraflow_trainer_hf import HFConfig
from astraflow_trainer_hf.backend import HFTrainerBackend

from astraflow.config import ModelConfig
from astraflow.models.tiny import make_tiny_model
from astraflow.rl.advantages import group_advantages
from astraflow.tasks.arithmetic import ArithmeticTasks
from astraflow.testing.trainer import prompt_completion, with_behaviour_logprobs
from astraflow.text import TextTokenizer, load_tokenizer
from astraflow.types import Batch, Task, TrainItem

RESULTS = Path(__file__).parent / "results" / "bf16_sparsity.json"


@torch.no_grad()
def sample(
    model: torch.nn.Module, tokenizer: TextTokenizer, prompt: list[int], n: int, max_new: int
) -> list[list[int]]:
    """``n`` completions at temperature 1, each ending at <eos> or ``max_new`` tokens."""
    ids = torch.tensor([prompt] * n)
    done = torch.zeros(n, dtype=torch.bool)
    for _ in range(max_new):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1].float()
        nxt = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == tokenizer.eos_token_id
        if done.all():
            break
    out = []
    for row in ids[:, len(prompt) :].tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        out.append(row[:end])
    return out


def rl_batch(
    backend: HFTrainerBackend, tokenizer: TextTokenizer, tasks: list[Task], group: int
) -> Batch:
    items = []
    for task in tasks:
        prompt = tokenizer.encode(task.prompt)
        completions = sample(backend.model, tokenizer, prompt, group, max_new=6)
        rewards = [float(tokenizer.decode(c).strip() == task.answer) for c in completions]
        for completion, advantage in zip(completions, group_advantages(rewards), strict=True):
            trajectory = prompt_completion(task.task_id, prompt, completion, 0.0)
            items.append(TrainItem(trajectory, advantage))
    return with_behaviour_logprobs(backend, Batch("bench", "policy", items))


def unchanged_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """Fraction of elements whose bf16 bits are identical (compared as int16)."""
    same = total = 0
    for name, old in before.items():
        same += int((old.view(torch.int16) == after[name].view(torch.int16)).sum())
        total += old.numel()
    return same / total


def measure(model_dir: str, dtype: str, lr: float, steps: int, prompts: int, group: int) -> dict:
    torch.manual_seed(0)
    rng = random.Random(0)
    train = list(ArithmeticTasks().train_tasks())
    tokenizer = load_tokenizer(model_dir)
    backend = HFTrainerBackend(HFConfig(dtype=dtype, lr=lr), model_dir)
    fractions = []
    for _ in range(steps):
        batch = rl_batch(backend, tokenizer, rng.sample(train, prompts), group)
        before = backend.export_weights()
        backend.train_step(batch)
        fractions.append(unchanged_fraction(before, backend.export_weights()))
    return {
        "mode": "bf16_weights" if dtype == "bfloat16" else "fp32_master",
        "lr": lr,
        "unchanged_per_step": fractions,
        "mean": statistics.fmean(fractions),
        "min": min(fractions),
        "max": max(fractions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4, 1e-3])
    parser.add_argument("--steps", type=int, default=5, help="AdamW steps per setting")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per batch")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tasks = list(ArithmeticTasks().train_tasks())
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "tiny", ModelConfig(), 0, tasks)
        rows = [
            measure(model_dir, dtype, lr, args.steps, args.prompts, args.group)
            for dtype in ("bfloat16", "float32")
            for lr in args.lrs
        ]
    print(f"{'mode':<14}{'lr':>8}{'mean':>10}{'min':>10}{'max':>10}   unchanged per step")
    for row in rows:
        print(
            f"{row['mode']:<14}{row['lr']:>8.0e}{row['mean']:>10.4f}{row['min']:>10.4f}"
            f"{row['max']:>10.4f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "model": "tiny (ModelConfig defaults)",
        "batch": f"{args.prompts} prompts x {args.group}",
        "steps": args.steps,
        "results": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
