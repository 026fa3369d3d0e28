"""A multi-turn workflow: the policy may call a tool before answering.

Protocol: the model writes ``calc(EXPR)`` (``workflow.tool=calc``: integer arithmetic,
evaluated without ``eval``) or ``python(EXPR)`` (``workflow.tool=python``: any Python
expression, evaluated in :mod:`astraflow.sandbox`); generation stops at ``)``; the
workflow appends the tool's answer as ``=RESULT,`` (tool tokens, loss-masked) and the
model continues. The text generated after the last tool output is the final answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from astraflow.contracts import PolicyHandle, Workflow
from astraflow.sandbox import Sandbox, SandboxConfig
from astraflow.schema import setting
from astraflow.trajectory import TrajectoryBuilder
from astraflow.types import TOOL, Task, Trajectory
from astraflow.workflows.builder import WorkflowConfig
from astraflow.workflows.groups import GroupConfig, first_of, sizes
from astraflow.workflows.tools import calculator, python, sandbox_from

TOOLS = ("calc", "python")


@dataclass
class ToolUseConfig(WorkflowConfig):
    """``workflow=tool_use``."""

    name: str = "tool_use"
    max_turns: int = setting(3, ge=1)
    tool: str = setting("calc", choices=TOOLS)
    #: limits of ``tool=python``'s runs
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(timeout=2.0))
    #: over-provisioned groups: start extra samples, train the first back (see
    #: :mod:`astraflow.workflows.groups`)
    group: GroupConfig = field(default_factory=GroupConfig)


class ToolUseWorkflow(Workflow):
    roles = ("policy",)

    def __init__(self, config, tokenizer, reward) -> None:
        super().__init__(config, tokenizer, reward)
        self.call = re.compile(rf"{config.tool}\(([^()]*)\)$")
        self._sandbox: Sandbox | None = None

    async def _tool(self, argument: str) -> str:
        if self.config.tool == "calc":
            return calculator(argument)
        if self._sandbox is None:  # started on first use: a config check runs nothing
            self._sandbox = sandbox_from(self.config.sandbox)
        return await python(self._sandbox, argument)

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        started, keep = sizes(group_size)  # over-provisioned: the first back are kept
        return await first_of(lambda i: self._attempt(task, policies, i), started, keep,
                              reward=lambda t: t.reward)

    async def _attempt(self, task: Task, policies: dict[str, PolicyHandle], index: int
                       ) -> Trajectory:
        (role,) = self.roles
        tok = self.tokenizer
        close = tok.encode(")")
        stops = [*tok.stop_token_ids, *close]
        builder = TrajectoryBuilder(task.task_id, task.metadata.get("group_id", task.task_id))
        builder.add_context(tok.encode_prompt(task.prompt))
        answer, calls = "", 0
        for turn in range(self.config.max_turns):
            gen = (await policies[role].generate(
                list(builder.tokens), n=1, max_new_tokens=self.config.max_new_tokens,
                temperature=self.config.temperature, stop_token_ids=stops,
            ))[0]
            builder.add_generation(role, gen)
            text = self.completion_text(gen.token_ids)
            call = self.call.search(text)
            last_turn = turn == self.config.max_turns - 1
            if call is None or gen.finish_reason != "stop" or last_turn:
                answer = text
                break
            calls += 1
            result = await self._tool(call.group(1))
            try:
                ids = tok.encode(f"={result},")
            except ValueError:  # a character the tokenizer cannot spell (a tiny vocabulary)
                ids = tok.encode("=error,")
            builder.add_context(ids, source=TOOL)
        score = await self.score(task, answer)
        return builder.build(role, score.value, {"task_type": task.task_type, "tool_calls": calls,
                                                 "sample": index}, score.outcome)
