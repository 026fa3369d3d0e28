"""The multi-turn tool-use workflow: tool output is context, never trained on."""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf

from astraflow.errors import ConfigError
from astraflow.plugins import get_registry
from astraflow.rewards.exact_match import ExactMatch
from astraflow.tasks.arithmetic import ArithmeticTasks
from astraflow.testing.engine import LoopThread
from astraflow.text import load_tokenizer
from astraflow.types import TOOL, Generation, Task
from astraflow.workflows.tool_use import ToolUseConfig, ToolUseWorkflow
from astraflow.workflows.tools import calculator


class ScriptedPolicy:
    """Replays fixed completions: pins down exactly which tokens are whose."""

    name = "policy"

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    async def generate(self, prompt_ids, *, n=1, max_new_tokens=None, temperature=None,
                       stop_token_ids=None):
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.turns.pop(0))
        stop = bool(stop_token_ids) and ids[-1] in stop_token_ids
        return [Generation(ids, [-0.5] * len(ids), "stop" if stop else "length", 7)]


def test_calculator_is_safe_and_exact():
    assert calculator("12+7") == "19" and calculator("3-9*2") == "-15"
    assert calculator("__import__('os')") == "error" and calculator("2**99") == "error"


def test_tool_tokens_are_masked_and_the_answer_after_the_tool_is_scored(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    workflow = ToolUseWorkflow(ToolUseConfig(), tok, ExactMatch())
    eos = tok.decode([tok.eos_token_id]) if tok.decode([tok.eos_token_id]) else ""
    policy = ScriptedPolicy(tok, ["calc(12+7)", "19" + eos])
    task = Task("t1", "12+7=", "19")
    (traj,) = asyncio.run(workflow.run(task, {"policy": policy}, 1))
    traj.validate()
    sources = [s.source for s in traj.spans]
    assert sources == ["prompt", "policy", TOOL, "policy"]
    tool = traj.spans[2]
    assert tok.decode(traj.tokens[tool.start:tool.end]) == "=19,"
    for span in traj.spans:
        mask = traj.loss_mask[span.start:span.end]
        assert mask == [int(span.source == "policy")] * (span.end - span.start)
        versions = traj.versions[span.start:span.end]
        assert versions == [7 if span.source == "policy" else -1] * (span.end - span.start)
    # the second turn saw the tool's answer as context
    assert tok.decode(policy.prompts[1]) == "12+7=calc(12+7)=19,"
    assert traj.reward == 1.0 and traj.metadata["tool_calls"] == 1


def test_tool_use_runs_end_to_end_on_a_real_engine(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    entry = get_registry().get("rollout_backend", "hf")
    backend = entry.create(OmegaConf.structured(entry.config_cls), tiny_model_dir)
    loop = LoopThread()
    loop.run(backend.start())
    try:
        from astraflow.raas.engines import EnginePolicy

        policy = EnginePolicy("policy", backend, {"max_new_tokens": 12, "temperature": 1.0})
        workflow = ToolUseWorkflow(ToolUseConfig(max_turns=3), tok, ExactMatch())
        tasks = ArithmeticTasks().eval_tasks()[:6]

        async def run_all():
            return await asyncio.gather(*(workflow.run(t, {"policy": policy}, 4)
                                          for t in tasks))

        results = loop.run(run_all())
    finally:
        loop.run(backend.shutdown())
        loop.close()
    trajectories = [t for group in results for t in group]
    assert len(trajectories) == 24
    for traj in trajectories:
        traj.validate()
        assert sum(traj.loss_mask) >= 1
        for span in traj.spans:
            expected = int(span.source == "policy")
            assert set(traj.loss_mask[span.start:span.end]) == {expected}
        assert traj.reward in (0.0, 1.0)


@pytest.mark.parametrize("expression", ["1+", "", "a+b", "(1+2"])
def test_malformed_tool_calls_get_an_error_not_an_exception(expression):
    assert calculator(expression) == "error"


def test_the_python_tool_runs_in_the_sandbox_and_a_hung_call_costs_one_turn(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    # only the hung call below is given a 1 s timeout: on a loaded machine starting the
    # sandbox's interpreter alone can take that long
    hasty, patient = ToolUseConfig(tool="python"), ToolUseConfig(tool="python")
    hasty.sandbox.timeout, patient.sandbox.timeout = 1.0, 30.0
    workflow = ToolUseWorkflow(patient, tok, ExactMatch())
    eos = tok.decode([tok.eos_token_id])
    task = Task("t1", "12*7=", "84")
    policy = ScriptedPolicy(tok, ["python(12*7)", "84" + eos])
    (traj,) = asyncio.run(workflow.run(task, {"policy": policy}, 1))
    assert tok.decode(policy.prompts[1]) == "12*7=python(12*7)=84,"
    assert traj.reward == 1.0 and traj.metadata["tool_calls"] == 1
    # a call that does not end in time, one that raises, one whose output ("True") the
    # tiny vocabulary cannot spell: each answers in one word and the episode goes on
    for call, answer, flow in (("9**9**9", "timeout", ToolUseWorkflow(hasty, tok, ExactMatch())),
                               ("1/0", "error", workflow), ("1==1", "error", workflow)):
        policy = ScriptedPolicy(tok, [f"python({call})", "84" + eos])
        (traj,) = asyncio.run(flow.run(task, {"policy": policy}, 1))
        assert tok.decode(policy.prompts[1]) == f"12*7=python({call})={answer},"
        assert traj.reward == 1.0


def test_an_unknown_tool_is_refused_as_the_config_is_composed():
    from astraflow.config import compose_config

    with pytest.raises(ConfigError) as info:
        compose_config(["workflow=tool_use", "workflow.tool=shell"])
    assert str(info.value) == "workflow.tool=shell: choose calc or python"
