"""A multi-turn workflow: the policy may call a calculator before answering.

Protocol: the model writes ``calc(EXPR)``; generation stops at ``)``; the workflow
appends the tool's answer as ``=RESULT,`` (tool tokens, loss-masked) and the model
continues. The text generated after the last tool output is the final answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astraflow.contracts import PolicyHandle, Workflow
from astraflow.types import TOOL, Task, Trajectory
from astraflow.workflows.builder import TrajectoryBuilder
from astraflow.workflows.tools import calculator

CALL = re.compile(r"calc\(([^()]*)\)$")


@dataclass
class ToolUseConfig:
    """``workflow=tool_use``."""

    name: str = "tool_use"
    max_turns: int = 3
    max_new_tokens: int = 12
    temperature: float = 1.0


class ToolUseWorkflow(Workflow):
    roles = ("policy",)

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        import asyncio

        attempts = [self._attempt(task, policies, i) for i in range(group_size)]
        return list(await asyncio.gather(*attempts))

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
            call = CALL.search(text)
            last_turn = turn == self.config.max_turns - 1
            if call is None or gen.finish_reason != "stop" or last_turn:
                answer = text
                break
            calls += 1
            builder.add_context(tok.encode(f"={calculator(call.group(1))},"), source=TOOL)
        score = await self.score(task, answer)
        return builder.build(role, score.value, {"task_type": task.task_type, "tool_calls": calls,
                                                 "sample": index, **score.metadata()})
