"""Claude Code and Codex CLI as the agent of a training run, unchanged:
``workflow=agent agent.command="python examples/agent/<harness>/run.py"``.

The model is the chat fixture's shape with a 128k context (the harnesses' 26-35k-token
prompts fit), taught to answer any turn briefly (:func:`make_terse_chat_model`): a
harness fails a reply cut at its limit, and a random model writes hundreds of tokens
before it ends one. Every rollout's harness exits 0 (a non-zero exit would fail the
rollout and count in ``reward_failed``), no request is answered with an error (the
node logs each on the console), and the trainer's log-probs of the trained tokens are
the engine's: tokens re-rendered from the harness's text would not be.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from astraflow.testing import launch_run, run_summary
from astraflow.testing.harnesses import (
    HarnessUnavailable,
    install_harness,
    make_terse_chat_model,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "agent"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def terse_model_dir() -> str:
    from astraflow.testing.pytest_plugin import _models_cache

    return make_terse_chat_model(_models_cache() / "test-chat-qwen2-128k-terse")


@pytest.mark.parametrize(("example", "command"), [("claude_code", "claude"),
                                                  ("codex", "codex")])
def test_a_harness_trains_unchanged(tmp_path, terse_model_dir, example, command):
    try:
        install_harness(command)
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "hi"}) + "\n"
                            for p in ("say hi", "greet me", "hello?", "wave")))
    run_dir = tmp_path / "run"
    proc = launch_run(
        tmp_path, "workflow=agent",
        f"agent.command={sys.executable} {EXAMPLES / example / 'run.py'}",
        "agent.max_tokens_cap=512", f"model.path={terse_model_dir}", "task=jsonl",
        f"task.train_files=[{data}]", f"task.tokenizer={terse_model_dir}",
        # a rollout is a harness process and a 35k-token prompt: no more than a step's;
        # one step (a step's forward and backward over two 35k-token sequences is 80 s of
        # a core): a later step's rollouts are the same harness on newer weights
        "node_concurrency=1", "steps=1", "batch_size=2", "group_size=2",
        f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 1
    train = [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").open())
             if r["kind"] == "train"]
    assert len(train) == 1 and all(r["reward_failed"] == 0 for r in train), train
    errors = re.findall(r"gateway: \S+ answered [45]\d\d.*", proc.stdout + proc.stderr)
    assert not errors, errors[:5]
    # the trainer's own log-probs of what it trains: the sampled tokens, to float rounding
    assert train[0]["staleness_max"] == 0 and train[0]["train/logprob_abs_diff"] < 1e-3, train
