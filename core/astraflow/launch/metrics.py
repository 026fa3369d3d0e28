"""Read the per-component metric streams of a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted((run_dir / "metrics").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line being written right now
    return sorted(records, key=lambda r: r.get("time", 0.0))


def by_policy(records: list[dict[str, Any]], kind: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("kind") == kind:
            out.setdefault(rec["policy"], []).append(rec)
    return out
