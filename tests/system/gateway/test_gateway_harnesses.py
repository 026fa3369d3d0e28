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
def long_node(long_chat_model_dir):
    # a random model's reply ends at its end-of-turn token in ~400 tokens on average:
    # the cap keeps a rollout's length the run's while leaving the end to the model
    n = start_node(long_chat_model_dir, ("policy",), max_tokens_cap=4000, tool_parser="hermes")
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


#: what the scripted engine writes: a shell call at the task's turn, then a last word
SHELL = "expr 6 \\* 7 | tee made.txt"  # its output, 42, is in no text the model wrote
CALLS = {"claude": ("Bash", {"command": SHELL}), "codex": ("exec_command", {"cmd": SHELL})}


def scripted_node(model_dir: str, command: str):
    """A real ``raas=hf`` engine whose sampling is forced to a script (a logits
    processor leaves one token possible a step): at a turn ending with the task it
    writes ``command``'s shell call, after a tool result ``done``. The log-probs are the
    model's own of those tokens, so the trajectory is trained like any other."""
    import torch
    from astraflow_raas_hf.backend import HFRolloutBackend
    from transformers import LogitsProcessor

    from astraflow.text import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    name, arguments = CALLS[command]
    call = ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments})
            + "\n</tool_call><|im_end|>")

    class Force(LogitsProcessor):
        def __init__(self, ids: list[int], start: int) -> None:
            self.ids, self.start = ids, start

        def __call__(self, input_ids, scores):
            step = min(input_ids.shape[1] - self.start, len(self.ids) - 1)
            forced = torch.full_like(scores, float("-inf"))
            forced[:, self.ids[step]] = 0.0
            return forced

    class Scripted(HFRolloutBackend):
        def _run_generate(self, model, cache, swaps, input_ids, attention, rows, *rest):
            assert len(rows) == 1  # long prompts run alone (raas.max_batch_tokens)
            tail = tokenizer.decode(rows[0].prompt_ids[-60:])
            reply = "done<|im_end|>" if "</tool_response>" in tail else call
            swaps = [*swaps, Force(tokenizer.encode(reply), input_ids.shape[1])]
            return super()._run_generate(model, cache, swaps, input_ids, attention, rows,
                                         *rest)

    node = start_node(model_dir, ("policy",), max_tokens_cap=256, tool_parser="hermes")
    from astraflow.plugins import get_registry

    entry = get_registry().get("rollout_backend", "hf")
    engine = Scripted(entry.config_cls(), model_dir)
    node.loop.run(engine.start())
    node.loop.run(node.spies["policy"].backend.shutdown())
    node.spies["policy"].backend = engine
    return node


@pytest.mark.parametrize("command", ["claude", "codex"])
def test_a_harness_runs_the_models_tool_call_and_the_rollout_trains(
        long_chat_model_dir, tmp_path, command):
    """Over two turns: the engine samples a shell call, the harness runs it (the file
    appears in its working directory) and sends the result back, the engine ends. The
    trajectory trains both sampled turns, the harness's tool result as context, and
    the trainer's log-probs of those tokens are the engine's."""
    from astraflow_trainer_hf import HFConfig
    from astraflow_trainer_hf.backend import HFTrainerBackend
    from omegaconf import OmegaConf

    from astraflow.types import Batch, TrainItem

    binary = harness(command)
    node = scripted_node(long_chat_model_dir, command)
    try:
        if command == "claude":
            argv = [str(binary), "-p", "CALL", "--max-turns", "3", "--allowedTools", "Bash"]
        else:
            provider = {"name": "astraflow", "base_url": f"{node.gateway.url}/v1",
                        "env_key": "OPENAI_API_KEY", "wire_api": "responses"}
            toml = "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in provider.items()) + "}"
            argv = [str(binary), "exec", "--skip-git-repo-check", "-m", "policy",
                    "--sandbox", "workspace-write", "-c", "model_provider=astraflow",
                    "-c", f"model_providers.astraflow={toml}", "CALL"]
        session, done = run_harness(node, tmp_path, argv, f"{command}-tool")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert (tmp_path / "work" / "made.txt").read_text().strip() == "42"
        assert set(node.gateway.answered) == {200}, node.gateway.answered
        assert session.calls == 2 and session.restarts == 0
        assert_token_exact(node, session)
        (traj,) = session.trajectories(1.0, {})
        # two sampled turns, and between them, as context, the tool's output
        trained = [k for k, m in enumerate(traj.loss_mask) if m]
        gap = next(k for k in range(len(trained) - 1) if trained[k + 1] > trained[k] + 1)
        between = node.tokenizer.decode(traj.tokens[trained[gap] + 1:trained[gap + 1]])
        assert "42" in between
        assert node.tokenizer.decode(traj.tokens[trained[gap + 1]:]).startswith("done")
    finally:
        stop_node(node)
    trainer = HFTrainerBackend(OmegaConf.structured(HFConfig()), long_chat_model_dir)
    metrics = trainer.train_step(Batch("harness", "policy", [TrainItem(traj, 1.0)]))
    assert metrics["tokens"] == sum(traj.loss_mask)
    assert metrics["logprob_abs_diff"] < 1e-3
