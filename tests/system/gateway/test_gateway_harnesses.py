"""Claude Code and Codex CLI, installed from the npm registry at their pinned versions,
run unchanged against a node's endpoint: every request they send is served (no 4xx or
5xx), each exits 0, and what they sampled is recorded token for token.

The model is the chat fixture's shape with a 128k context (the harnesses' system
prompts and tool lists are 26-35k of its tokens), randomly initialised: its replies
are noise that ends at its end-of-turn token, which is all a protocol needs.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from astraflow.testing.harnesses import HarnessUnavailable, install_harness
from astraflow.types import Task
from astraflow.workflows.agent_worker import ClientConfig

from .conftest import start_node, stop_node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def harness(command: str):
    try:
        return install_harness(command)
    except HarnessUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def long_node():
    from astraflow.testing.models import make_chat_model
    from astraflow.testing.pytest_plugin import _models_cache

    model = make_chat_model(_models_cache() / "test-chat-qwen2-128k-seed0", arch="qwen2",
                            seed=0, context=131072)
    # a random model's reply ends at its end-of-turn token in ~400 tokens on average:
    # the cap keeps a rollout's length the run's while leaving the end to the model
    n = start_node(model, ("policy",), max_tokens_cap=4000, tool_parser="hermes")
    yield n
    stop_node(n)


def run_harness(node, tmp_path, argv: list[str], task_id: str):
    node.spies["policy"].sampled.clear()
    node.gateway.answered.clear()
    session = node.open(Task(task_id, "say hi", ""), ["policy"])
    client = ClientConfig(f"{node.gateway.url}/v1", session.key, "policy", ["policy"])
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), **client.env(),
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL, check=False)
    node.gateway.close(session.key)
    return session, done


def assert_token_exact(node, session) -> None:
    """Every call recorded, and the trained tokens are the engine's samples in order."""
    sampled = node.spies["policy"].sampled
    assert session.calls == len(sampled) >= 1
    trained = [t for traj in session.trajectories(1.0, {}) for t, m in
               zip(traj.tokens, traj.loss_mask, strict=True) if m]
    assert trained == [t for g in sampled for t in g.token_ids]


def test_claude_code_runs_unchanged_against_the_endpoint(long_node, tmp_path):
    claude = harness("claude")
    session, done = run_harness(long_node, tmp_path, [
        str(claude), "-p", "say hi", "--max-turns", "1"], "claude")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert set(long_node.gateway.answered) == {200}, long_node.gateway.answered
    assert_token_exact(long_node, session)
    # its own prompt: tens of thousands of tokens of instructions and tool schemas
    prompt = session.trajectories(1.0, {})[0]
    assert len(prompt.tokens) > 20_000


def test_codex_cli_runs_unchanged_against_the_endpoint(long_node, tmp_path):
    codex = harness("codex")
    provider = {"name": "astraflow", "base_url": f"{long_node.gateway.url}/v1",
                "env_key": "OPENAI_API_KEY", "wire_api": "responses"}
    toml = "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in provider.items()) + "}"
    session, done = run_harness(long_node, tmp_path, [
        str(codex), "exec", "--skip-git-repo-check", "-m", "policy",
        "-c", "model_provider=astraflow", "-c", f"model_providers.astraflow={toml}",
        "say hi"], "codex")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert set(long_node.gateway.answered) == {200}, long_node.gateway.answered
    assert_token_exact(long_node, session)
