"""``workflow=agent`` on a node's engine: command agents, failures, timeouts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from omegaconf import OmegaConf

from astraflow.rewards.exact_match import ExactMatch
from astraflow.types import Task
from astraflow.workflows.agent import AgentConfig, AgentWorkflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agent"


def workflow(node, **settings) -> AgentWorkflow:
    config = OmegaConf.structured(AgentConfig(**settings))
    return AgentWorkflow(config, node.tokenizer, ExactMatch())


def run(node, flow: AgentWorkflow, task: Task, group: int) -> list:
    task.metadata["group_id"] = task.task_id
    try:
        return node.loop.run(flow.run(task, {"policy": node.policies["policy"]}, group))
    finally:
        node.loop.run(flow.aclose())


def test_a_command_agent_gets_the_endpoint_in_its_environment(node):
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(EXAMPLES / 'command_agent.py'))}"
    flow = workflow(node, command=command, timeout=60)
    trajectories = run(node, flow, Task("cmd", "3+4=", "7"), 3)
    assert len(trajectories) == 3
    for traj in trajectories:
        assert traj.metadata["agent_calls"] == 1 and not traj.metadata.get("reward_failed")
        answer = node.tokenizer.decode([t for t, m in zip(traj.tokens, traj.loss_mask,
                                                          strict=True) if m])
        assert traj.reward == float(answer.strip() == "7")  # the agent's own reward


def test_a_raising_agent_and_a_slow_one_fail_their_rollouts_only(node, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text('''
import asyncio
from openai import AsyncOpenAI


async def run(task, client):
    api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    await api.chat.completions.create(model=client.model, max_tokens=4,
                                      messages=[{"role": "user", "content": task.prompt}])
    if task.task_id == "boom":
        raise RuntimeError("the sandbox is gone")
    if task.task_id == "slow":
        await asyncio.sleep(3600)
    return 1.0
''')
    flow = workflow(node, path=str(agent), timeout=5)
    (ok,) = run(node, flow, Task("fine", "1+1=", "2"), 1)
    assert ok.reward == 1.0 and not ok.metadata.get("reward_failed")
    (boom,) = run(node, flow, Task("boom", "1+1=", "2"), 1)
    assert boom.metadata["reward_failed"] and "the sandbox is gone" in boom.metadata["reward_error"]
    (slow,) = run(node, flow, Task("slow", "1+1=", "2"), 1)
    assert slow.metadata["reward_failed"] and "agent.timeout=5s" in slow.metadata["reward_error"]
    assert flow.failed == 2 and "the sandbox is gone" in flow.first_error
