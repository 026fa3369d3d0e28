"""``reward=regex``: the answer is whatever a pattern finds in the completion.

For output formats a few characters of regex describe better than any parser (``Answer:
(\\w+)``, a JSON field, a choice letter). The pattern is compiled once, when the reward is
built, so a typo is a config error at start-up rather than a failed sample per rollout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from astraflow.contracts import Reward
from astraflow.errors import ConfigError
from astraflow.rewards.base import RewardConfig
from astraflow.types import Task

#: the letters ``reward.flags`` accepts, as in Python's inline flags ``(?is)``
FLAGS: dict[str, re.RegexFlag] = {
    "a": re.ASCII,
    "i": re.IGNORECASE,
    "m": re.MULTILINE,
    "s": re.DOTALL,
    "x": re.VERBOSE,
}


@dataclass
class RegexConfig(RewardConfig):
    """``pattern`` is searched in the completion; its first group (or the whole match)
    is the answer. ``flags`` are letters of Python's regex flags, e.g. ``"is"``."""

    name: str = "regex"
    pattern: str = ""
    flags: str = ""


def compile_pattern(pattern: str, flags: str = "") -> re.Pattern[str]:
    """The compiled pattern, or a :class:`ConfigError` the user can act on in one line."""
    if not pattern:
        raise ConfigError("reward=regex needs reward.pattern=REGEX (e.g. 'Answer: (\\w+)')")
    value = 0
    for letter in flags:
        if letter.lower() not in FLAGS:
            raise ConfigError(
                f"reward.flags={flags!r}: unknown flag {letter!r}; "
                f"use letters of {''.join(FLAGS)!r}"
            )
        value |= FLAGS[letter.lower()]
    try:
        return re.compile(pattern, value)
    except re.error as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(
            f"reward.pattern={pattern!r} is not a valid regular expression: {reason}"
        ) from None


class RegexReward(Reward):
    """1.0 when the pattern's first group (or whole match), stripped, equals the task's
    answer, stripped; 0.0 when it differs or the pattern finds nothing."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.pattern = compile_pattern(
            str(getattr(config, "pattern", "") or ""), str(getattr(config, "flags", "") or "")
        )

    def __call__(self, task: Task, completion: str) -> float:
        match = self.pattern.search(completion)
        if match is None:
            return 0.0
        found = match.group(1) if self.pattern.groups else match.group(0)
        if found is None:  # the first group is optional and did not take part
            return 0.0
        return float(found.strip() == (task.answer or "").strip())
