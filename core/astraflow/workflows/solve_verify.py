"""Two collaborating policies: a solver answers, a verifier judges, the solver may retry.

Protocol (character-level, like the tiny tokenizer): the solver sees ``a+b=`` and
answers; the verifier sees ``a+b=ANSWER:`` and says ``y`` or ``n``; on ``n`` the solver
sees its history, the verdict and ``=``, and answers once more. Rewards: the solver's is
the correctness of its final answer; the verifier's is 1 when its verdict matches the
truth of the answer it judged. Every attempt yields exactly one trajectory per policy,
so both policies receive the same number of samples per task. Each trajectory trains
only its own policy: the other policy's tokens are in the context and loss-masked.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from astraflow.contracts import PolicyHandle, Workflow
from astraflow.types import Generation, Task, Trajectory
from astraflow.workflows.builder import TrajectoryBuilder
from astraflow.workflows.latency import Latency, LatencyConfig

ACCEPT, REJECT = "y", "n"


@dataclass
class SolveVerifyConfig:
    """``workflow=solve_verify``."""

    name: str = "solve_verify"
    max_new_tokens: int = 6
    temperature: float = 1.0
    retry: bool = True
    latency: LatencyConfig = field(default_factory=LatencyConfig)


class SolveVerifyWorkflow(Workflow):
    roles = ("solver", "verifier")

    def __init__(self, config, tokenizer, reward) -> None:
        super().__init__(config, tokenizer, reward)
        self.latency = Latency(config.latency)

    @staticmethod
    def warmstart_tasks(tasks: list[Task], seed: int = 0) -> list[Task]:
        """Supervised examples of both formats, so both policies start able to answer."""
        rng = random.Random(seed)
        out = list(tasks)
        for task in tasks:
            truth = int(task.answer or 0)
            wrong = truth + rng.choice([-2, -1, 1, 2, 10, -10])
            for shown, verdict in ((truth, ACCEPT), (wrong, REJECT)):
                out.append(Task(f"{task.task_id}:{shown}", f"{task.prompt}{shown}:", verdict))
        return out

    async def _generate(self, policy: PolicyHandle, context: list[int]) -> Generation:
        await self.latency.wait()
        (gen,) = await policy.generate(context, n=1, max_new_tokens=self.config.max_new_tokens,
                                       temperature=self.config.temperature,
                                       stop_token_ids=self.tokenizer.stop_token_ids)
        return gen

    def _text(self, gen: Generation) -> str:
        return self.completion_text(gen.token_ids).strip()

    async def _attempt(self, task: Task, policies: dict[str, PolicyHandle],
                       group_id: str) -> list[Trajectory]:
        tok = self.tokenizer
        prompt = tok.encode_prompt(task.prompt)
        solver = TrajectoryBuilder(task.task_id, group_id)
        solver.add_context(prompt)
        gen = await self._generate(policies["solver"], solver.tokens)
        solver.add_generation("solver", gen)
        answer = self._text(gen)
        first = await self.score(task, answer)
        correct = first.value > 0
        # the verifier judges the answer as text, without the solver's end token
        keep = len(gen.token_ids) - int(bool(gen.token_ids)
                                        and gen.token_ids[-1] in tok.stop_token_ids)
        verifier = TrajectoryBuilder(task.task_id, group_id)
        verifier.add_context(prompt)
        verifier.add_generation("solver", Generation(gen.token_ids[:keep], gen.logprobs[:keep],
                                                     gen.finish_reason, gen.version))
        verifier.add_context(tok.encode(":"))
        verdict_gen = await self._generate(policies["verifier"], verifier.tokens)
        verifier.add_generation("verifier", verdict_gen)
        verdict = self._text(verdict_gen)[:1]
        judged_right = verdict in (ACCEPT, REJECT) and (verdict == ACCEPT) == correct
        retried = verdict == REJECT and self.config.retry
        if retried:
            solver.add_context(tok.encode(":"))
            solver.add_generation("verifier", verdict_gen)
            solver.add_context(tok.encode("="))
            retry = await self._generate(policies["solver"], solver.tokens)
            solver.add_generation("solver", retry)
        final = await self.score(task, self._text(retry)) if retried else first
        meta = {"task_type": task.task_type, "retried": retried, "verdict": verdict}
        # a verdict on an answer whose reward failed judged nothing: it fails too
        return [solver.build("solver", final.value, {**meta, **final.metadata()}),
                verifier.build("verifier", float(judged_right),
                               {**meta, **(first.metadata() if first.failed else {})})]

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        group_id = task.metadata.get("group_id", task.task_id)
        attempts = await asyncio.gather(*(self._attempt(task, policies, group_id)
                                          for _ in range(group_size)))
        return [traj for attempt in attempts for traj in attempt]
