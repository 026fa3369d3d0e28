"""Train your own model on your own data: a Qwen2-layout checkpoint with a byte-level BPE
tokenizer, ChatML special tokens and a chat template (made here, no hub), dataset files
written by the test, and a reward function in a file outside the package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_rows import problems, write_jsonl
from omegaconf import OmegaConf

from astraflow.testing import launch_run, run_summary


def summary(run_dir: Path, policy: str = "policy") -> dict:
    return run_summary(run_dir)[policy]


def test_chat_prompts_are_rendered_once_as_transformers_renders_them(chat_model_dir):
    from transformers import AutoTokenizer

    from astraflow.text import load_tokenizer

    ours, theirs = load_tokenizer(chat_model_dir), AutoTokenizer.from_pretrained(chat_model_dir)
    for messages in ([{"role": "user", "content": "12+7="}],
                     [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "héllo wörld, 你好 12 + 7 ="}]):
        expected = theirs.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
        assert ours.encode_prompt(messages) == list(expected)
    # a plain prompt goes through the template as a user turn; a system prompt leads
    assert ours.configure({"system_prompt": "Be brief."}).encode_prompt("12+7=") == \
        ours.encode_prompt([{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "12+7="}])
    im_end = ours.token_id("<|im_end|>")
    endoftext = ours.token_id("<|endoftext|>")
    assert ours.eos_token_id == im_end and set(ours.stop_token_ids) == {im_end, endoftext}


def test_foreign_special_tokens_load_and_a_bos_is_added(wordlevel_model_dir):
    from astraflow.text import load_tokenizer

    tok = load_tokenizer(wordlevel_model_dir)
    assert tok.eos_token_id == tok.token_id("</s>")
    assert tok.pad_token_id == tok.eos_token_id  # the checkpoint declares no pad token
    ids = tok.encode_prompt("1 + 2 =")
    assert ids[0] == tok.token_id("<s>") and tok.bos_token_id == ids[0]
    assert tok.decode(ids) == "1 + 2 ="


@pytest.mark.slow
@pytest.mark.parametrize("raas", ["hf", "vllm"])
def test_behaviour_logprobs_match_the_trainer_on_chat_prompts(raas, chat_model_dir):
    if raas == "vllm":
        pytest.importorskip("vllm")
    from astraflow.testing.rollout import logprob_gap

    worst, count = logprob_gap(raas, "hf", chat_model_dir, prompts=("12+7=", "3-15=", "9+9="))
    print(f"max |{raas} behaviour - hf recomputed| log-prob over {count} tokens: {worst:.2e}")
    assert count >= 12
    assert worst < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("backends", [("hf", "megatron"), ("vllm", "hf")])
def test_short_runs_with_a_chat_checkpoint(tmp_path, chat_model_dir, backends):
    raas, trainer = backends
    if raas == "vllm":
        pytest.importorskip("vllm")
    train, _ = problems()
    write_jsonl(tmp_path / "train.jsonl", train)
    run_dir = tmp_path / "run"
    # vLLM serves in bfloat16 for a float32 trainer, with the truncated-IS correction
    extra = ["raas.dtype=bfloat16", "trainer.rollout_correction=tis"] if raas == "vllm" else []
    launch_run(tmp_path, f"model.path={chat_model_dir}", "task=jsonl",
           "task.train_files=[train.jsonl]", "task.eval_size=8", f"raas={raas}",
           f"trainer={trainer}", "+experiment=smoke", f"run_dir={run_dir}", *extra)
    # the first step trains on what the start weights generated: its engine-vs-trainer
    # gap is the engines' numerical mismatch alone -- rounding-level for two float32
    # engines, far larger for a bfloat16 engine
    first = json.loads((run_dir / "metrics" / "train-policy.jsonl").open().readline())
    gap = first["train/rollout_logprob_gap_fresh"]
    assert first["train/rollout_logprob_gap_max"] >= gap
    assert 1e-4 < gap < 1.0 if raas == "vllm" else gap < 1e-5, gap
    result = summary(run_dir)
    assert result["steps"] == 3 and result["final_eval_accuracy"] is not None
    assert result["trajectories_trained"] == 3 * 8
    assert OmegaConf.load(run_dir / "config.yaml").raas.name == raas
    # the evaluator's engine scored the start weights and, reloaded in place (vLLM: its
    # reload_weights), the final ones
    evals = [json.loads(line) for line in (run_dir / "metrics" / "eval-policy.jsonl").open()]
    assert [e["version"] for e in evals] == [0, 3]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run_dir / "final" / "policy")


@pytest.mark.slow
def test_a_wordlevel_checkpoint_with_foreign_special_tokens_trains(tmp_path,
                                                                    wordlevel_model_dir):
    rows = [{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a in range(5) for b in range(5)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={wordlevel_model_dir}", "task=jsonl",
           "task.train_files=[train.jsonl]", "task.eval_size=5", "+experiment=smoke",
           f"run_dir={run_dir}")
    assert summary(run_dir)["steps"] == 3


def verl_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = i % 10, (i * 7) % 10
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "train", "index": i, "answer": f"#### {a + b}"},
        })
    return rows


@pytest.mark.slow
def test_a_verl_parquet_file_with_the_math_reward(tmp_path, chat_model_dir):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(verl_rows(48)), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(verl_rows(8)), tmp_path / "test.parquet")
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={chat_model_dir}", "task=verl",
           "task.train_files=[train.parquet]", "task.eval_files=[test.parquet]",
           "reward=math", "+experiment=smoke", f"run_dir={run_dir}")
    result = summary(run_dir)
    assert result["steps"] == 3
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    # the math reward's own metric shows the answers it could find in each batch
    assert all("reward/answer_found" in r for r in records if r["kind"] == "train")


FLAKY_REWARD = '''
import itertools

_calls = itertools.count()


def score(task, completion):
    if next(_calls) % 10 == 9:
        raise RuntimeError("the judge is down")
    return float(completion.strip() == task.answer)
'''


@pytest.mark.slow
def test_a_reward_that_raises_on_a_tenth_of_samples(tmp_path, tiny_model_dir):
    (tmp_path / "flaky.py").write_text(FLAKY_REWARD)
    run_dir = tmp_path / "run"
    proc = launch_run(tmp_path, f"model.path={tiny_model_dir}", "reward=python",
                  "reward.path=flaky.py", "steps=6", "batch_size=32", "group_size=8",
                  "eval_every=6", f"run_dir={run_dir}")
    assert "the judge is down" in proc.stderr  # shown on the console once
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 6
    failed = sum(r["reward_failed"] for r in train)
    assert 0 < failed < 0.25 * 6 * 32
    assert train[-1]["reward_failed_total"] >= failed
    events = [r for r in records if r.get("event") == "reward_failure"]
    assert events and "RuntimeError: the judge is down" in events[0]["error"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_each_layout_serves_in_vllm_with_the_trainers_log_probs(arch, tmp_path_factory):
    """Llama (untied head, <s> via the post-processor) and Mistral layouts load in vLLM
    and sample the log-probs the HF trainer computes. Qwen3's attention (q/k norms, one
    KV head) is the tiny Qwen3-MoE's, served by vLLM in test_e2e_moe.py; Qwen2's is the
    chat model's, above."""
    pytest.importorskip("vllm")
    from astraflow.testing.models import make_chat_model
    from astraflow.testing.rollout import logprob_gap

    model = make_chat_model(tmp_path_factory.mktemp(arch) / "model", arch=arch, seed=0)
    worst, count = logprob_gap("vllm", "hf", model, prompts=("12+7=", "9+9="))
    print(f"{arch}: max |vllm - hf| log-prob over {count} tokens: {worst:.2e}")
    assert count >= 8
    assert worst < 1e-4
