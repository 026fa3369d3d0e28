"""``reward=math``: the final answer of a worked solution, compared by mathematical value.

Models write the same answer many ways (``\\frac{1}{2}``, ``0.5``, ``1/2``), so string
equality under-rewards correct work. The final answer is taken from where solutions
conventionally put it (the last ``\\boxed{}``, a GSM8K-style ``####`` line, else the last
number) and compared with the ground truth by ``math-verify`` (``pip install
'astraflow[math]'``), which parses LaTeX and plain expressions into SymPy.

Rewards run on worker threads, and math-verify's own time limits are built on
``signal.alarm``, which only works on the main thread: they are switched off here
(``parsing_timeout=None``, ``timeout_seconds=None``) and ``reward.timeout`` bounds each
sample instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from astraflow.contracts import Reward
from astraflow.errors import ConfigError
from astraflow.rewards.base import RewardConfig
from astraflow.types import Task

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
#: a number in running text: a minus sign only when it cannot be a subtraction
#: (``5-3`` has the numbers 5 and 3), thousands commas only in groups of three
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])-)?(?<![\w.])"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+|(?=\.\d))(?:\.\d+)?(?:/\d+)?"
)
#: a whole string that is just a number (the fast path needs no parser)
_PLAIN = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(?:\.\d+)?(?:/\d+)?")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
#: larger numbers are never compared by value: SymPy computes them exactly, in C code
#: no timeout interrupts, for minutes or until memory runs out (``9^{9^{9^{9}}}``)
_MAX_BITS = 1_000_000


@dataclass
class MathConfig(RewardConfig):
    """Math answers compared by value; the shared settings are all it needs."""

    name: str = "math"


def _braced(text: str, start: int) -> str | None:
    """The text up to the brace closing the one opened just before ``start``, or None
    when the text ends first (a truncated generation)."""
    depth = 1
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":  # \{ and \} are literal braces, not grouping
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def _last_boxed(text: str) -> str | None:
    for match in reversed(list(_BOXED.finditer(text))):
        content = _braced(text, match.end())
        if content is not None and content.strip():
            return content.strip()
    return None


def _after_hashes(text: str) -> str | None:
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1]
    line = next((line.strip() for line in tail.splitlines() if line.strip()), "")
    line = line.rstrip(".").strip()
    return line or None


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str) -> str | None:
    """The final answer of a solution: the content of the last ``\\boxed{}`` (or
    ``\\fbox{}``), else what follows the last ``####``, else the last number; None when
    the text has none of them."""
    return _last_boxed(text) or _after_hashes(text) or _last_number(text)


def ground_truth(answer: str) -> str:
    """The dataset's answer as a comparable string: datasets often store a whole
    solution (``... #### 42``) or a boxed answer rather than the bare value; anything
    else is the answer itself (``\\frac{1}{2}`` must not become its last number)."""
    if _BOXED.search(answer) or "####" in answer:
        return extract_answer(answer) or answer.strip()
    return answer.strip()


def as_number(text: str) -> Fraction | None:
    """``text`` as an exact number when it is nothing but one (``1,000``, ``-0.5``,
    ``3/4``); None otherwise."""
    text = text.strip()
    if not _PLAIN.fullmatch(text):
        return None
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _log2_bound(expr: Any) -> float:
    """A rough upper bound of log2 of the magnitude ``expr`` evaluates to, computed
    without evaluating it; ``inf`` when even that would be too large."""
    if expr.is_Rational:
        return math.log2(max(abs(expr.p), abs(expr.q), 1))
    if expr.is_Float:
        return math.log2(max(abs(float(expr)), 1.0))
    if expr.is_Pow:
        exponent = _log2_bound(expr.exp)
        return math.inf if exponent > 64 else _log2_bound(expr.base) * 2.0**exponent
    if expr.is_Mul:
        return sum(_log2_bound(arg) for arg in expr.args)
    if expr.is_Add:
        return max(_log2_bound(arg) for arg in expr.args) + math.log2(len(expr.args))
    if type(expr).__name__ in ("factorial", "factorial2", "gamma", "subfactorial"):
        size = _log2_bound(expr.args[0]) if expr.args else 0.0
        return math.inf if size > 64 else 2.0**size * (size + 1)
    return max((_log2_bound(arg) for arg in getattr(expr, "args", ())), default=0.0)


def too_large(parsed: list[Any]) -> bool:
    """Whether any parsed answer holds a number too large to evaluate
    (``9^{9^{9^{9}}}``, ``(10^{10})!``): a model finds such answers by chance or on
    purpose, and one would keep a reward thread busy long after its sample timed out."""
    try:
        return any(_log2_bound(item) > _MAX_BITS for item in parsed if hasattr(item, "is_Pow"))
    except (RecursionError, OverflowError, TypeError, ValueError):
        return True


def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]]:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ConfigError(
            "reward=math needs the math-verify package: pip install 'astraflow[math]'"
        ) from None
    return parse, verify


class MathReward(Reward):
    """``{"score": 1.0 or 0.0, "answer_found": 1.0 or 0.0}``: whether the completion's
    final answer equals the task's answer in value, and whether it gave one at all (a
    model that stops answering and one that answers wrongly need different fixes)."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._parse, self._verify = _math_verify()

    def __call__(self, task: Task, completion: str) -> dict[str, float]:
        if task.answer is None:
            raise ValueError(f"reward=math needs an answer; task {task.task_id!r} has none")
        predicted = extract_answer(completion)
        if predicted is None:
            return {"score": 0.0, "answer_found": 0.0}
        correct = self.equivalent(ground_truth(task.answer), predicted)
        return {"score": float(correct), "answer_found": 1.0}

    def equivalent(self, gold: str, predicted: str) -> bool:
        """Whether two final answers have the same value (``gold`` first: math-verify's
        comparison is not symmetric for equations and intervals)."""
        gold_number, predicted_number = as_number(gold), as_number(predicted)
        if gold_number is not None and gold_number == predicted_number:
            return True
        gold_parsed, predicted_parsed = self._parsed(gold), self._parsed(predicted)
        if not gold_parsed or not predicted_parsed or too_large(predicted_parsed + gold_parsed):
            return gold.strip() == predicted.strip()
        return bool(self._verify(gold_parsed, predicted_parsed, timeout_seconds=None))

    def _parsed(self, answer: str) -> list[Any]:
        if as_number(answer) is not None:
            answer = answer.replace(",", "")  # else "1,000" reads as a tuple
        # math-verify finds LaTeX between delimiters: a bare answer gets them
        source = answer if _UNESCAPED_DOLLAR.search(answer) else f"${answer}$"
        return list(self._parse(source, parsing_timeout=None))
