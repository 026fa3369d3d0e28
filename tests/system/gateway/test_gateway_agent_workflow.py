"""``workflow=agent`` on a node's engine: command agents, failures, timeouts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from omegaconf import OmegaConf

from astraflow.rewards.exact_match import ExactMatch
from astraflow.types import Task
from astraflow.workflows.agent import AgentConfig, AgentWorkflow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "agent"


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
        assert traj.metadata["agent_calls"] == 1 and not traj.outcome.failed
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
    assert ok.reward == 1.0 and not ok.outcome.failed
    (boom,) = run(node, flow, Task("boom", "1+1=", "2"), 1)
    assert boom.outcome.failed and "the sandbox is gone" in boom.outcome.reason
    (slow,) = run(node, flow, Task("slow", "1+1=", "2"), 1)
    assert slow.outcome.failed and "agent.timeout=5s" in slow.outcome.reason
    assert flow.failed == 2 and "the sandbox is gone" in flow.first_error


WORKER_AGENT = '''
import os
import time
from pathlib import Path

from openai import AsyncOpenAI


async def run(task, client):
    print("what an agent prints is not the node's protocol")
    Path(os.environ["PIDS"], task.task_id).write_text(str(os.getpid()))
    api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    await api.chat.completions.create(model=client.model, max_tokens=4,
                                      messages=[{"role": "user", "content": task.prompt}])
    if task.task_id.startswith("crash"):
        os._exit(3)
    if task.task_id == "block":
        time.sleep(2)  # a synchronous call inside an async agent
    return {"reward": 1.0}
'''


def test_agents_run_in_a_worker_process_that_may_crash_or_block(node, tmp_path, monkeypatch):
    import os

    agent = tmp_path / "agent.py"
    agent.write_text(WORKER_AGENT)
    monkeypatch.setenv("PIDS", str(tmp_path))
    flow = workflow(node, path=str(agent), timeout=60, workers=1)

    def one(task_id: str):
        task = Task(task_id, "1+1=", "2")
        task.metadata["group_id"] = task_id
        (traj,) = node.loop.run(flow.run(task, {"policy": node.policies["policy"]}, 1))
        return traj

    try:
        fine = one("fine")
        assert fine.reward == 1.0 and not fine.outcome.failed
        first_pid = int((tmp_path / "fine").read_text())
        assert first_pid != os.getpid()  # the agent ran outside the node
        crash = one("crash")  # the worker dies mid-rollout: that rollout fails, counted
        assert crash.outcome.failed
        assert "exited with code 3" in crash.outcome.reason
        again = one("again")  # ... and the next rollout gets a new worker
        assert again.reward == 1.0 and int((tmp_path / "again").read_text()) != first_pid
        assert flow.failed == 1
    finally:
        node.loop.run(flow.aclose())


def test_a_worker_that_keeps_dying_is_not_started_again(node, tmp_path, monkeypatch):
    agent = tmp_path / "agent.py"
    agent.write_text(WORKER_AGENT)
    monkeypatch.setenv("PIDS", str(tmp_path))
    flow = workflow(node, path=str(agent), timeout=60, workers=1)
    try:
        for i in range(3):
            task = Task(f"crash{i}", "1+1=", "2")
            task.metadata["group_id"] = task.task_id
            (traj,) = node.loop.run(flow.run(task, {"policy": node.policies["policy"]}, 1))
            assert traj.outcome.failed
        # the third rollout failed before its agent made a call: counted all the same,
        # with the prompt as context and nothing to train
        assert "not started again" in traj.outcome.reason
        assert not any(traj.loss_mask) and traj.tokens
        assert flow.failed == 3
        assert not (tmp_path / "crash2").exists()  # no third process was started
    finally:
        node.loop.run(flow.aclose())


def test_an_agent_that_blocks_stalls_the_node_only_on_the_node_s_own_loop(node, tmp_path,
                                                                         monkeypatch):
    """With agent.workers=0 a blocking agent stops the node's event loop (its engine,
    gateway, leases) for as long as it blocks; in a worker process it does not."""
    import asyncio
    import time

    agent = tmp_path / "agent.py"
    agent.write_text(WORKER_AGENT)
    monkeypatch.setenv("PIDS", str(tmp_path))

    async def longest_stall(flow: AgentWorkflow) -> float:
        task = Task("block", "1+1=", "2")
        task.metadata["group_id"] = "block"
        rollout = asyncio.ensure_future(flow.run(task, {"policy": node.policies["policy"]}, 1))
        worst, last = 0.0, time.monotonic()
        while not rollout.done():
            await asyncio.sleep(0.02)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        (traj,) = rollout.result()
        assert traj.reward == 1.0
        return worst

    stalls = {}
    for workers in (0, 1):
        flow = workflow(node, path=str(agent), timeout=60, workers=workers)
        try:
            stalls[workers] = node.loop.run(longest_stall(flow))
        finally:
            node.loop.run(flow.aclose())
    assert stalls[0] >= 1.9, stalls
    assert stalls[1] < 1.0, stalls


def test_one_client_shared_by_every_rollout_records_each_call_to_its_own(node):
    """examples/agent/answer_agent.py keeps one client per process and sends each
    rollout's key with its call: concurrent rollouts of one worker, each recorded to the
    rollout that made it (its own prompt as context), none to another."""
    import asyncio

    flow = workflow(node, path=str(EXAMPLES / "answer_agent.py"), timeout=60, workers=1)
    tasks = [Task(f"t{a}", f"{a}+{a}=", str(2 * a)) for a in range(1, 7)]
    for task in tasks:
        task.metadata["group_id"] = task.task_id

    async def all_groups():
        policies = {"policy": node.policies["policy"]}
        return await asyncio.gather(*(flow.run(task, policies, 2) for task in tasks))

    try:
        groups = node.loop.run(all_groups())
    finally:
        node.loop.run(flow.aclose())
    for task, trajectories in zip(tasks, groups, strict=True):
        assert len(trajectories) == 2
        for traj in trajectories:
            assert traj.metadata["agent_calls"] == 1 and not traj.outcome.failed
            context = node.tokenizer.decode([t for t, m in zip(traj.tokens, traj.loss_mask,
                                                               strict=True) if not m])
            assert task.prompt in context, (task.prompt, context)
    assert flow.failed == 0
