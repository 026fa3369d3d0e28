"""Train an agent written for the OpenAI API, unchanged: ``workflow=agent``.

The agents below are files outside the package that know only a base URL, a key and a
model name; AstraFlow never sees their conversation except through the endpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astraflow.testing import launch_run, run_summary

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "agent"
CALCULATOR_AGENT = (EXAMPLES / "calculator_agent.py").read_text()


#: a seconds-long run; the held-out set is cut down too, since each evaluation runs the
#: agent on every held-out task (sampled and greedy)
SMOKE = ("+experiment=smoke", "task.num_eval=10", "eval_samples=2")


def records(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r for r in rows if r["kind"] == kind]


def smoke_agent_run(tmp_path: Path, source: str) -> list[dict]:
    """A seconds-long run of the agent in ``source``: its train records, every step's
    rewards computed (none failed)."""
    (tmp_path / "agent.py").write_text(source)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, "workflow=agent", "agent.path=agent.py", *SMOKE, f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 3
    train = records(run_dir, "train")
    assert train and all(r["reward_failed"] == 0 for r in train)
    return train


@pytest.mark.slow
def test_an_openai_client_agent_trains_through_the_endpoint(tmp_path):
    smoke_agent_run(tmp_path, CALCULATOR_AGENT)


HANGING_AGENT = '''
import asyncio
import random
from openai import AsyncOpenAI


async def run(task, client):
    api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    reply = await api.chat.completions.create(
        model=client.model, messages=[{"role": "user", "content": task.prompt}])
    if random.random() < 0.3:  # stuck in a tool that never returns
        await asyncio.sleep(3600)
    return float(reply.choices[0].message.content.strip() == task.answer)
'''


@pytest.mark.slow
def test_an_agent_that_hangs_fails_its_rollout_and_the_run_goes_on(tmp_path):
    (tmp_path / "agent.py").write_text(HANGING_AGENT)
    run_dir = tmp_path / "run"
    # The agent builds an OpenAI client per rollout (a TLS context: ~0.06 s of CPU), and
    # a timed-out group's successors all start together. 16 tasks in flight (64 agents
    # at once, on 2 cores shared with the trainer and the evaluator) took up to 9.6 s
    # before their first request with one core busy elsewhere, and a slower machine
    # timed out 95% of its rollouts; 4 tasks (16 agents) leave the 10 s limit to the hangs
    launch_run(tmp_path, "workflow=agent", "agent.path=agent.py", "agent.timeout=10",
           "node_concurrency=4", "reward.max_failure_fraction=0.9", *SMOKE,
           f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 3
    # the run names the hang where the user looks (the console and the run's records)
    (event,) = [r for r in records(run_dir, "launcher") if r.get("event") == "reward_failure"]
    assert "AgentTimeout" in event["error"]
    # the evaluation ran the same agent, hangs included, and finished
    evals = records(run_dir, "eval")
    assert evals and sum(r["eval_reward_failed"] for r in evals) > 0
    # about 30% hang; the others answer well within the limit. Which groups fill the
    # three batches is a race (the hung ones arrive 10 s late), so no lower bound here
    train = records(run_dir, "train")
    assert sum(r["reward_failed"] for r in train) < 0.6 * sum(r["train/sequences"] for r in train)


TWO_POLICY_AGENT = '''
from openai import AsyncOpenAI


async def run(task, client):
    """A solver answers; a verifier (another model name, another policy) judges."""
    api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    answer = await api.chat.completions.create(
        model="solver", max_tokens=6, messages=[{"role": "user", "content": task.prompt}])
    text = answer.choices[0].message.content.strip()
    await api.chat.completions.create(
        model="verifier", max_tokens=2,
        messages=[{"role": "user", "content": f"{task.prompt}{text}:"}])
    return float(text == task.answer)
'''


@pytest.mark.slow
def test_two_model_names_route_each_segment_to_its_policy(tmp_path):
    (tmp_path / "agent.py").write_text(TWO_POLICY_AGENT)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, "workflow=agent", "agent.path=agent.py", "agent.models=[solver,verifier]",
           *SMOKE, f"run_dir={run_dir}")
    policies = run_summary(run_dir)
    assert set(policies) == {"solver", "verifier"}
    assert policies["solver"]["steps"] == 3 and policies["verifier"]["steps"] == 3
    # the trained batches: the verifier's sequences hold its verdicts (2 tokens at most),
    # the solver's its answers (up to 6)
    train = records(run_dir, "train")
    verifier = [r for r in train if r["policy"] == "verifier"]
    solver = [r for r in train if r["policy"] == "solver"]
    assert all(r["train/tokens"] <= 2 * r["train/sequences"] for r in verifier)
    assert sum(r["train/tokens"] for r in solver) > 2 * sum(r["train/sequences"] for r in solver)


AGENTS_SDK_AGENT = (EXAMPLES / "sdk_agent.py").read_text()


@pytest.mark.slow
def test_an_openai_agents_sdk_agent_runs_unchanged(tmp_path):
    pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install 'astraflow[agents]'")
    train = smoke_agent_run(tmp_path, AGENTS_SDK_AGENT)
    assert sum(r["train/sequences"] for r in train) >= 3 * 8


BROKEN_AGENT = '''
async def run(task, client):
    raise KeyError("OPENAI_ORG")  # a bug before the agent's first call
'''


@pytest.mark.slow
def test_an_agent_that_fails_before_its_first_call_stops_the_run_with_its_error(tmp_path):
    """Its rollouts sample nothing, yet each one counts as a failure: the run stops on
    reward.max_failure_fraction with the agent's traceback, instead of training on
    nothing or re-leasing the same tasks forever."""
    import subprocess
    import sys

    (tmp_path / "agent.py").write_text(BROKEN_AGENT)
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "launcher.progress=false", "workflow=agent",
         "agent.path=agent.py", "reward.max_failure_fraction=0.5", *SMOKE,
         f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode != 0
    assert "KeyError: 'OPENAI_ORG'" in proc.stderr, proc.stderr[-3000:]
    assert "the agent or its reward failed on" in proc.stderr
