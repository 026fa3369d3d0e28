"""Your own chat checkpoint learns from your dataset files with a reward from your own file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from chat_rows import problems, write_jsonl

from astraflow.testing import launch_run, run_summary

REWARD = '''
def score(task, completion):
    """1 for the right number; the length is logged as an extra metric."""
    return {"score": float(completion.strip() == task.answer), "chars": len(completion)}
'''


@pytest.fixture(scope="module")
def warm_chat_model(chat_model_dir, tmp_path_factory) -> str:
    """The chat fixture after supervised steps on the training rows' chat format, so RL
    starts from a model that sometimes answers right (as the default run's tiny model)."""
    from astraflow.testing.models import sft_warmstart
    from astraflow.text import load_tokenizer

    out = tmp_path_factory.mktemp("warm") / "model"
    shutil.copytree(chat_model_dir, out)
    tok = load_tokenizer(out)
    train, _ = problems()
    examples = [(tok.encode_prompt(r["prompt"]),
                 [*tok.encode(str(r["answer"])), tok.eos_token_id]) for r in train]
    sft_warmstart(out, examples, steps=300, lr=3e-4, seed=0)
    return str(out)


@pytest.mark.slow
def test_a_chat_model_learns_from_files_with_a_reward_from_a_file(tmp_path, warm_chat_model):
    train, held_out = problems()
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "test.jsonl", held_out)
    (tmp_path / "my_rewards.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={warm_chat_model}", "task=jsonl",
           "task.train_files=[train.jsonl]", "task.eval_files=[test.jsonl]",
           "reward=python", "reward.path=my_rewards.py", "reward.function=score",
           # held-out accuracy at the start and the end alone, 32 samples a task: with 8,
           # the start (the same weights) read anywhere from 0.23 to 0.30
           "steps=200", "batch_size=128", "eval_every=0", "eval_samples=32", "trainer.lr=3e-4",
           f"run_dir={run_dir}")
    result = run_summary(run_dir)["policy"]
    gain = result["final_eval_accuracy"] - result["start_eval_accuracy"]
    print(f"held-out accuracy {result['start_eval_accuracy']:.3f} -> "
          f"{result['final_eval_accuracy']:.3f} ({gain:+.3f})")
    # measured alone on 2 AMD EPYC cores (25-27 s): 0.244 -> 0.413 (+0.17) and 0.238 ->
    # 0.436 (+0.20, seed 1); 300 steps gained +0.24. At lr 2e-4 it took 400 steps to
    # gain +0.28
    assert gain >= 0.12
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train_records = [r for r in records if r["kind"] == "train"]
    # the extra number the reward returned is logged per step
    assert all("reward/chars" in r for r in train_records)
    assert sum(r["reward_failed"] for r in train_records) == 0
    # the final weights are a checkpoint with the tokenizer it was trained with
    final = run_dir / "final" / "policy"
    assert (final / "tokenizer.json").read_bytes() == (
        Path(warm_chat_model) / "tokenizer.json").read_bytes()
