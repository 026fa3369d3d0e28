"""Solver + selector: the solver samples k candidates, a selector policy picks one.

Protocol (in the tiny model's characters): the solver answers the prompt ``k`` times;
the selector sees the prompt and the numbered candidates and writes the number of the
one it picks::

    f(1)=5,f(2)=7,f(x)=
    0:2*x+3
    1:2*x+5
    pick:0

Credit, each role for what it controls:

- Every candidate is a solver trajectory rewarded by the run's reward (``reward=code``:
  the share of the task's tests it passes), grouped with the task's other candidates --
  the same signal the solver would get alone.
- The selector is rewarded by how much better its pick is than a pick at random:
  ``score(picked) - mean(score(candidates))``. When every candidate scores the same the
  pick changes nothing and earns nothing, whatever it was; an unreadable pick scores as
  the worst candidate. The candidates are its context (loss-masked).

The solver's trajectories report the pair's result -- the picked candidate's score
(``selected``) -- and the best of the ``k`` (``best_of_k``) as reward metrics.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass

from astraflow.contracts import PolicyHandle
from astraflow.schema import like, setting
from astraflow.types import RewardOutcome, Task, Trajectory
from astraflow.workflows.builder import (
    WORKFLOW,
    AttemptsWorkflow,
    EnvConfig,
    TrajectoryBuilder,
    WorkflowConfig,
    without_stop,
)

PICK = "pick:"


@dataclass
class SolveSelectConfig(EnvConfig, WorkflowConfig):
    """``workflow=solve_select``: ``candidates`` solver samples per attempt."""

    name: str = "solve_select"
    candidates: int = setting(4, ge=2, le=10, why="the selector answers with one digit")
    selector_max_new_tokens: int = like(WORKFLOW["max_new_tokens"], default=2)


def perturb(answer: str, rng: random.Random) -> str:
    """A wrong answer that looks like ``answer``: one of its digits changed (or a digit
    appended when it has none)."""
    digits = [i for i, ch in enumerate(answer) if ch.isdigit()]
    if not digits:
        return answer + str(rng.randrange(10))
    i = rng.choice(digits)
    other = rng.choice([d for d in "0123456789" if d != answer[i]])
    return answer[:i] + other + answer[i + 1:]


class SolveSelectWorkflow(AttemptsWorkflow):
    roles = ("solver", "selector")

    @staticmethod
    def warmstart_tasks(tasks: list[Task], seed: int = 0) -> list[Task]:
        """The task's answers, and picks among a right answer and look-alike wrong ones."""
        rng = random.Random(seed)
        out = list(tasks)
        for task in tasks:
            right = str(task.metadata.get("reference") or task.answer or "")
            if not right:
                continue
            shown = [perturb(right, rng) for _ in range(3)]
            at = rng.randrange(len(shown) + 1)
            shown.insert(at, right)
            out.append(Task(f"{task.task_id}:pick", selector_context(str(task.prompt), shown),
                            str(at)))
        return out

    async def _attempt(self, task: Task, policies: dict[str, PolicyHandle],
                       group_id: str) -> list[Trajectory]:
        tok, cfg = self.tokenizer, self.config
        prompt = tok.encode_prompt(task.prompt)
        await self.latency.wait()
        gens = await policies["solver"].generate(
            prompt, n=cfg.candidates, max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature, stop_token_ids=tok.stop_token_ids)
        texts = [self.completion_text(g.token_ids).strip() for g in gens]
        scores = await asyncio.gather(*(self.score(task, text) for text in texts))
        selector = TrajectoryBuilder(task.task_id, group_id)
        selector.add_context(prompt)
        for i, gen in enumerate(gens):
            selector.add_context(tok.encode(f"\n{i}:"))
            selector.add_generation("solver", without_stop(gen, tok.stop_token_ids))
        selector.add_context(tok.encode(f"\n{PICK}"))
        await self.latency.wait()
        (pick_gen,) = await policies["selector"].generate(
            selector.tokens, n=1, max_new_tokens=cfg.selector_max_new_tokens,
            temperature=cfg.temperature, stop_token_ids=tok.stop_token_ids)
        selector.add_generation("selector", pick_gen)
        values = [s.value for s in scores]
        pick = parse_pick(self.completion_text(pick_gen.token_ids), len(gens))
        picked = values[pick] if pick is not None else min(values)
        meta = {"task_type": task.task_type}
        metrics = {"selected": picked, "best_of_k": max(values)}
        out = []
        for gen, score in zip(gens, scores, strict=True):
            builder = TrajectoryBuilder(task.task_id, group_id)
            builder.add_context(prompt)
            builder.add_generation("solver", gen)
            outcome = score.outcome
            if not score.failed:
                outcome.metrics.update(metrics)
            out.append(builder.build("solver", score.value, meta, outcome))
        failed = [s for s in scores if s.failed]
        # a pick among candidates whose reward failed judged nothing: it fails too
        out.append(selector.build(
            "selector", picked - sum(values) / len(values),
            {**meta, "pick": pick},
            failed[0].outcome if failed else RewardOutcome(metrics=metrics)))
        return out



def selector_context(prompt: str, candidates: list[str]) -> str:
    """The selector's view as text (the format a warm start teaches)."""
    listed = "".join(f"\n{i}:{c}" for i, c in enumerate(candidates))
    return f"{prompt}{listed}\n{PICK}"


def parse_pick(text: str, count: int) -> int | None:
    """The candidate a pick names, or None for no valid number."""
    match = re.match(r"\s*(\d+)", text)
    if not match or int(match.group(1)) >= count:
        return None
    return int(match.group(1))
