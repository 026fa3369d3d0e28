"""A reward in your own file: ``reward=python reward.path=examples/gsm8k/reward.py``.

``score(task, completion)`` gets the task (``task.answer``, and every field of the row in
``task.metadata``) and the model's text; it returns a float, or a dict with ``score`` and
any extra numbers, which are logged per step as ``reward/<name>``. ``async def`` works
too. If it raises or takes longer than ``reward.timeout``, that sample is scored as
failed: counted, shown with its traceback, and left out of its group's advantages.
"""

from __future__ import annotations

import re

FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def score(task, completion: str) -> dict:
    found = FINAL.findall(completion)
    answer = found[-1].replace(",", "") if found else None
    correct = answer is not None and float(answer) == float(task.answer)
    return {"score": float(correct), "formatted": float(answer is not None),
            "length": float(len(completion))}
