"""Two collaborating policies: a solver answers, a verifier judges, the solver may retry.

Protocol (character-level, like the tiny tokenizer): the solver sees ``a+b=`` and
answers; the verifier sees ``a+b=ANSWER:`` and says ``y`` or ``n``; on ``n`` the solver
sees its first answer, the verdict and ``=`` (``a+b=ANSWER:n=``) and answers once more.
With ``retries`` above 1 the verifier judges that answer too, and on ``n`` the solver
tries again, shown the latest rejected answer, up to ``retries`` answers after the first.

Credit, so that each role learns what it controls:

- The solver's *first answer* is a trajectory of its own, rewarded by its correctness
  alone and grouped with the task's other first answers -- exactly the signal the solver
  gets when it trains alone, so the verifier never takes credit away from it.
- A *retry* is a second solver trajectory: the first answer and the verdict are context
  (masked), the retried answer is trained and rewarded by its correctness. With
  ``retry_group=task`` (default) it is grouped with the task's first answers, so its
  baseline is how often the task is solved at all: a retry that fixes an answer earns
  credit even when it is the task's only retry (alone in a group it would earn none).
  ``retry_group=retries`` groups it with the task's other retries only. The verifier
  thus buys the solver extra attempts where it judged it wrong: a task whose first
  answers all failed, which teaches a lone solver nothing, still teaches it through a
  retry that succeeds.
  Retries do not count in held-out accuracy (``eval: false``).
- The verifier is rewarded 1 for a correct verdict, on right and on wrong answers alike.
  With ``balance_verifier`` it trains only on groups that judged both right and wrong
  answers (the others are judged and acted on, not trained on): a weak solver is wrong
  most of the time, and a verifier trained on every group learns that ``n`` is nearly
  always right -- then it rejects everything and its verdict says nothing.

The solver's trajectories report ``first_answer`` and ``final_answer`` (after the retry)
as reward metrics, so a run shows both the solver's own accuracy and the pair's.
Each trajectory trains only its own policy: the other policy's tokens are in the
context and loss-masked.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from astraflow.contracts import PolicyHandle
from astraflow.schema import like, setting
from astraflow.types import Generation, RewardOutcome, Task, Trajectory
from astraflow.workflows.builder import (
    WORKFLOW,
    EnvWorkflow,
    TrajectoryBuilder,
    WorkflowConfig,
    without_stop,
)
from astraflow.workflows.latency import LatencyConfig

ACCEPT, REJECT = "y", "n"
#: trajectory metadata: False keeps a trajectory out of held-out accuracy
EVAL = "eval"
#: the source of an earlier turn of the same policy shown again as context
EARLIER = "earlier"


@dataclass
class SolveVerifyConfig(WorkflowConfig):
    """``workflow=solve_verify``."""

    name: str = "solve_verify"
    max_new_tokens: int = like(WORKFLOW["max_new_tokens"], default=6)
    retry: bool = True
    retries: int = setting(1, ge=1, why="answers after a rejection: each but the last is "
                                        "judged again")
    retry_group: str = setting("task", choices=("task", "retries"))
    balance_verifier: bool = True
    #: an environment call per sample before it is scored (a verifier service, a
    #: sandbox): ``latency.kind=lognormal latency.median=0.1`` models agentic waits
    latency: LatencyConfig = field(default_factory=LatencyConfig)


@dataclass
class _Attempt:
    first: Trajectory
    verdict: Trajectory
    answer_right: bool
    retries: list[Trajectory]


class SolveVerifyWorkflow(EnvWorkflow):
    roles = ("solver", "verifier")

    @staticmethod
    def warmstart_tasks(tasks: list[Task], seed: int = 0) -> list[Task]:
        """Supervised examples of all three formats -- answer, verdict, retry -- so both
        policies start able to play their part, right and wrong answers equally often."""
        rng = random.Random(seed)
        out = list(tasks)
        for task in tasks:
            # a task may say what plausible wrong answers look like (task=subset_sum:
            # listed numbers with another sum); otherwise the answer is a number, and a
            # near miss is wrong
            if "wrong" in task.metadata:
                wrongs = [str(w) for w in task.metadata["wrong"]]
            else:
                wrongs = [str(int(task.answer or 0) + rng.choice([-2, -1, 1, 2, 10, -10]))]
            truth = task.answer or ""
            out.append(Task(f"{task.task_id}:{truth}", f"{task.prompt}{truth}:", ACCEPT))
            if not wrongs:
                continue
            wrong = rng.choice(wrongs)
            out.append(Task(f"{task.task_id}:{wrong}", f"{task.prompt}{wrong}:", REJECT))
            out.append(Task(f"{task.task_id}:{wrong}:retry",
                            f"{task.prompt}{wrong}:{REJECT}=", task.answer))
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
                       group_id: str) -> _Attempt:
        tok = self.tokenizer
        prompt = tok.encode_prompt(task.prompt)
        meta = {"task_type": task.task_type}
        solver = TrajectoryBuilder(task.task_id, group_id)
        solver.add_context(prompt)
        gen = await self._generate(policies["solver"], solver.tokens)
        solver.add_generation("solver", gen)
        first = await self.score(task, self._text(gen))
        right = first.value > 0
        shown = without_stop(gen, tok.stop_token_ids)
        verifier, verdict_gen = await self._judge(task.task_id, group_id, prompt, shown,
                                                  policies["verifier"])
        verdict = self._text(verdict_gen)[:1]
        judged_right = verdict in (ACCEPT, REJECT) and (verdict == ACCEPT) == right
        retries: list[Trajectory] = []
        final = first
        rejected, rejection, latest = shown, verdict_gen, verdict
        while (latest == REJECT and self.config.retry
               and len(retries) < self.config.retries):
            # the rejected answer and the verdict are context: the same format whichever
            # retry this is
            again = TrajectoryBuilder(task.task_id, group_id if self.config.retry_group
                                      == "task" else f"{group_id}/retry")
            again.add_context(prompt)
            again.add_context(rejected.token_ids, source=EARLIER)
            again.add_context(tok.encode(":"))
            again.add_generation("verifier", without_stop(rejection, tok.stop_token_ids))
            again.add_context(tok.encode("="))
            retry_gen = await self._generate(policies["solver"], again.tokens)
            again.add_generation("solver", retry_gen)
            final = await self.score(task, self._text(retry_gen))
            retries.append(again.build("solver", final.value,
                                       {**meta, EVAL: False, "retried": True}, final.outcome))
            if len(retries) < self.config.retries:  # judged again, as a first answer is
                rejected = without_stop(retry_gen, tok.stop_token_ids)
                _, rejection = await self._judge(task.task_id, group_id, prompt, rejected,
                                                 policies["verifier"])
                latest = self._text(rejection)[:1]
        fixed = final.value > 0
        metrics = {"first_answer": float(first.value), "final_answer": float(final.value),
                   "retried": float(bool(retries)),
                   # what the retries did: a wrong answer made right, a right one lost
                   "fixed": float(not right and fixed), "broke": float(right and not fixed)}
        outcome = first.outcome
        if not first.failed:
            outcome.metrics.update(metrics)
        first_traj = solver.build("solver", first.value, {**meta, "verdict": verdict}, outcome)
        # a verdict on an answer whose reward failed judged nothing: it fails too
        # per class, so that a run shows the verifier's balanced accuracy: the mean of
        # ``accept_right`` (on right answers) and ``reject_wrong`` (on wrong ones)
        judged = RewardOutcome(metrics={"accept_right" if right else "reject_wrong":
                                        float(judged_right)})
        verdict_traj = verifier.build(
            "verifier", float(judged_right),
            {**meta, "verdict": verdict, "answer_right": right},
            first.outcome if first.failed else judged)
        return _Attempt(first_traj, verdict_traj, right, retries)

    async def _judge(self, task_id: str, group_id: str, prompt: list[int],
                     answer: Generation, verifier: PolicyHandle
                     ) -> tuple[TrajectoryBuilder, Generation]:
        """The verifier's verdict on ``answer`` (``a+b=ANSWER:`` -> ``y``/``n``), and the
        verifier's trajectory so far: trained for a first answer, only acted on for a
        retried one."""
        judged = TrajectoryBuilder(task_id, group_id)
        judged.add_context(prompt)
        judged.add_generation("solver", answer)
        judged.add_context(self.tokenizer.encode(":"))
        verdict = await self._generate(verifier, judged.tokens)
        judged.add_generation("verifier", verdict)
        return judged, verdict

    def _verdicts(self, attempts: list[_Attempt]) -> list[Trajectory]:
        """The verdicts the verifier trains on: all of them, or with
        ``balance_verifier`` only a group that judged both right and wrong answers.

        Group-normalised advantages sum to zero within a group, so in a mixed group
        the verdicts on right answers weigh as much as those on wrong ones however few
        they are. A group of only wrong answers can teach just "say n" -- with a weak
        solver that is most groups, and a verifier trained on them rejects everything.
        """
        verdicts = [a.verdict for a in attempts]
        if not self.config.balance_verifier or len(attempts) == 1:
            return verdicts  # one attempt (a greedy evaluation): nothing to balance
        classes = {a.answer_right for a in attempts}
        return verdicts if len(classes) == 2 else []

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        group_id = task.metadata.get("group_id", task.task_id)
        attempts = await asyncio.gather(*(self._attempt(task, policies, group_id)
                                          for _ in range(group_size)))
        solver = [a.first for a in attempts] + [r for a in attempts for r in a.retries]
        return solver + self._verdicts(attempts)
