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
           # held-out accuracy at the start and the end alone, 64 samples a task (a standard
           # error of ~0.009 each): with 8 the start (the same weights) read anywhere from
           # 0.23 to 0.30, with 32 from 0.24 to 0.28
           "steps=250", "batch_size=128", "eval_every=0", "eval_samples=64", "trainer.lr=3e-4",
           f"run_dir={run_dir}")
    result = run_summary(run_dir)["policy"]
    gain = result["final_eval_accuracy"] - result["start_eval_accuracy"]
    print(f"held-out accuracy {result['start_eval_accuracy']:.3f} -> "
          f"{result['final_eval_accuracy']:.3f} ({gain:+.3f})")
    # 200 steps at 32 samples gained +0.15 to +0.19 (2 AMD EPYC cores, seeds 0-2, two
    # busy processes beside it as the suite's other lanes) and once +0.112 in the suite,
    # under this bar. 250 steps at 64 samples, the same load: +0.245, +0.187, +0.184,
    # +0.185 (seeds 0-3, 56-59 s). At lr 2e-4 it took 400 steps to gain +0.28
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
