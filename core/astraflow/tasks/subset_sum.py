"""``task=subset_sum``: pick numbers from a short list that add up to a target.

A task on which checking an answer is much easier than finding one: the prompt lists
``size`` numbers and a target, ``3,1,4,5,2 to 9=``; an answer is some of the listed
numbers joined by ``+`` (``3+4+2``). Finding one is a search over the list's subsets;
checking one is a short chain of additions and a comparison. The default shape (five
numbers of 1..5, three of them to pick) is the one where the tiny model, warm-started
for ``solve_verify``, checks far better than it finds (held-out, greedy: answers 0.77
right, verdicts 0.92 balanced accuracy); with two numbers of 1..9 to pick it finds
(0.89) but cannot check (0.55), with numbers up to 9 and three to pick it does neither.

Every target is the sum of ``pick`` of the numbers and none of the numbers alone, so an
answer always adds at least two; any subset that sums to the target is right, not only
the one the task was built from. Use it with ``reward=subset_sum``, which checks exactly
that.

Each task carries its ``numbers`` and ``target`` in its metadata (for the reward) and a
few plausible ``wrong`` answers -- listed numbers with another sum -- that workflows which
judge answers (``solve_verify``) use to warm-start a verifier on wrong answers.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from astraflow.contracts import Reward, TaskSource
from astraflow.errors import ConfigError
from astraflow.rewards.base import RewardConfig
from astraflow.schema import setting
from astraflow.types import Task

_ANSWER = re.compile(r"\d+(?:\+\d+)*")


@dataclass
class SubsetSumConfig:
    """``size`` numbers in ``1..max_number``, a target that ``pick`` of them add up to;
    ``num_train`` problems to train on and ``num_eval`` held out, drawn with ``seed``."""

    name: str = "subset_sum"
    size: int = setting(5, ge=2, le=9)
    pick: int = setting(3, ge=2)
    max_number: int = setting(5, ge=2, le=99)
    num_train: int = setting(4000, ge=1)
    num_eval: int = setting(200, ge=0)
    seed: int = setting(1234, ge=0)

    @staticmethod
    def relations(task) -> list[str]:
        if task.pick > task.size:
            return [f"task.pick={task.pick}: choose 2..{task.size} (task.size={task.size} "
                    "numbers are listed)"]
        return []


def check(numbers: list[int], target: int, completion: str) -> bool:
    """True if ``completion`` is listed numbers (each used at most as often as listed)
    joined by ``+`` whose sum is ``target``."""
    text = completion.strip()
    if not _ANSWER.fullmatch(text):
        return False
    used = [int(part) for part in text.split("+")]
    return sum(used) == target and not Counter(used) - Counter(numbers)


class SubsetSumTasks(TaskSource):
    """Problems drawn once (seeded), distinct, split into train and held-out eval."""

    def __init__(self, config: SubsetSumConfig | None = None) -> None:
        super().__init__(config or SubsetSumConfig())
        cfg = self.config
        if wrong := SubsetSumConfig.relations(cfg):
            raise ConfigError(wrong[0])
        rng = random.Random(cfg.seed)
        want = cfg.num_train + cfg.num_eval
        seen: set[tuple[tuple[int, ...], int]] = set()
        problems: list[tuple[list[int], list[int], int]] = []
        # the space is large (9^4 lists times their targets by default); a small one is
        # exhausted, not looped over forever
        for _ in range(want * 20):
            if len(problems) == want:
                break
            numbers = [rng.randint(1, cfg.max_number) for _ in range(cfg.size)]
            chosen = sorted(rng.sample(range(cfg.size), cfg.pick))
            target = sum(numbers[i] for i in chosen)
            if target in numbers or (tuple(numbers), target) in seen:
                continue  # one number alone would do, or drawn already
            seen.add((tuple(numbers), target))
            problems.append((numbers, chosen, target))
        if len(problems) < want:
            raise ConfigError(
                f"task.num_train + task.num_eval = {want}: only {len(problems)} distinct "
                f"subset-sum problems were found with task.size={cfg.size}, "
                f"task.max_number={cfg.max_number}; ask for fewer or widen the space")
        self._eval = [self._task(p, "eval", i, rng) for i, p in enumerate(problems[: cfg.num_eval])]
        self._train = [self._task(p, "train", i, rng)
                       for i, p in enumerate(problems[cfg.num_eval:])]

    @staticmethod
    def _task(problem: tuple[list[int], list[int], int], split: str, index: int,
              rng: random.Random) -> Task:
        numbers, chosen, target = problem
        answer = "+".join(str(numbers[i]) for i in chosen)
        wrong = sorted({"+".join(str(numbers[i]) for i in subset)
                        for subset in itertools.combinations(range(len(numbers)), len(chosen))
                        if sum(numbers[i] for i in subset) != target})
        rng.shuffle(wrong)
        listed = ",".join(map(str, numbers))
        return Task(task_id=f"{split}-{index}-{listed}-{target}", prompt=f"{listed} to {target}=",
                    answer=answer, task_type="subset_sum",
                    metadata={"numbers": numbers, "target": target, "wrong": wrong[:3]})

    def train_tasks(self) -> Iterator[Task]:
        return iter(self._train)

    def eval_tasks(self) -> list[Task]:
        return list(self._eval)


@dataclass
class SubsetSumRewardConfig(RewardConfig):
    """``reward=subset_sum`` (for ``task=subset_sum``)."""

    name: str = "subset_sum"


class SubsetSumReward(Reward):
    """1.0 when the completion is listed numbers joined by ``+`` that sum to the target
    (the task's ``numbers`` and ``target`` metadata); any such subset is right."""

    inline = True

    def __init__(self, config: RewardConfig | None = None) -> None:
        super().__init__(config or SubsetSumRewardConfig())

    def __call__(self, task: Task, completion: str) -> float:
        meta = task.metadata
        if "numbers" not in meta or "target" not in meta:
            raise ValueError(f"task {task.task_id!r} has no numbers/target metadata for "
                             "reward=subset_sum: use it with task=subset_sum")
        return float(check([int(n) for n in meta["numbers"]], int(meta["target"]), completion))
