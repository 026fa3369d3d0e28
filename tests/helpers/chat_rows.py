"""Dataset rows of the own-model tests: single-digit sums and differences as chat
messages, written as JSONL files as a user would have them."""

from __future__ import annotations

import json
import random
from pathlib import Path


def problems(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Single-digit sums and differences as chat rows; 40 held out."""
    rows = [{"prompt": [{"role": "user", "content": f"{a}{op}{b}="}],
             "answer": a + b if op == "+" else a - b, "op": op}
            for a in range(10) for b in range(10) for op in "+-"]
    random.Random(seed).shuffle(rows)
    return rows[40:], rows[:40]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
