"""Live progress of a local run: per-policy step, reward, eval accuracy, versions,
buffers and throughput, refreshed from the metric streams and ``/v1/status``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from rich.console import Console
from rich.live import Live
from rich.table import Table

from astraflow.components import policy_names
from astraflow.launch.metrics import by_policy, read_records


class Progress:
    def __init__(self, cfg: DictConfig, run_dir: Path, enabled: bool = True) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.started = time.time()
        self.live: Live | None = None
        self._last_plain = 0.0

    def __enter__(self) -> Progress:
        if self.enabled and self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def table(self, status: dict[str, Any]) -> Table:
        records = read_records(self.run_dir)
        train, evals = by_policy(records, "train"), by_policy(records, "eval")
        elapsed = time.time() - self.started
        restarts: dict[str, int] = {}
        for rec in records:
            if rec.get("kind") == "launcher" and rec.get("event") == "restart":
                restarts[rec["component"]] = rec["restart"]
        caption = ("restarted: " + ", ".join(f"{k} x{v}" for k, v in restarts.items())
                   if restarts else None)
        table = Table(title=f"AstraFlow  {self.run_dir.name}  {elapsed:5.0f}s", caption=caption)
        for col in ("policy", "step", "version", "reward", "eval acc", "buffer",
                    "traj/s", "wait"):
            table.add_column(col, justify="right")
        policies = status.get("policies", {})
        for policy in policy_names(self.cfg):
            tr = train.get(policy, [])
            ev = evals.get(policy, [])
            last = tr[-1] if tr else {}
            recent = tr[-5:]
            reward = sum(r["reward_mean"] for r in recent) / len(recent) if recent else 0.0
            info = policies.get(policy, {})
            trained = sum(r["batch_size"] for r in tr)
            wait = sum(r["wait_seconds"] for r in tr) / max(
                sum(r["wait_seconds"] + r["step_seconds"] for r in tr), 1e-9)
            table.add_row(
                policy, f"{last.get('step', 0)}/{self.cfg.steps}", str(last.get("version", 0)),
                f"{reward:.3f}",
                " ".join(f"{e['eval_accuracy']:.2f}" for e in ev[-4:]) or "-",
                str(info.get("buffered", "-")), f"{trained / max(elapsed, 1e-9):.1f}",
                f"{wait:.0%}",
            )
        return table

    def update(self, status: dict[str, Any]) -> None:
        if not self.enabled:
            return
        table = self.table(status)
        if self.live is not None:
            self.live.update(table)
        elif time.time() - self._last_plain > 15:  # not a terminal: a line now and then
            self._last_plain = time.time()
            self.console.print(table)
