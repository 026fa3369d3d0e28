"""Environment and tool latency for agentic workloads on CPU.

Real agentic rollouts wait on tools, sandboxes and other models, with a long tail:
most turns are quick, a few are very slow. This model lets a CPU run reproduce that
straggler behaviour (which is what separates asynchronous from synchronous RL).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

from astraflow.schema import setting

#: ``latency.kind``
KINDS = ("none", "fixed", "lognormal")


@dataclass
class LatencyConfig:
    """Per-turn delay: ``lognormal`` with ``median`` seconds and shape ``sigma``, capped
    at ``max``; ``fixed`` waits ``median``; ``none`` never waits."""

    kind: str = setting("none", choices=KINDS)
    median: float = setting(0.0, ge=0)
    sigma: float = setting(1.0, ge=0)
    max: float = setting(30.0, ge=0)


class Latency:
    def __init__(self, config: LatencyConfig, seed: int | None = None) -> None:
        self.config = config
        self.rng = random.Random(seed)

    def sample(self) -> float:
        cfg = self.config
        if cfg.kind == "none" or cfg.median <= 0:
            return 0.0
        if cfg.kind == "fixed":
            return min(cfg.median, cfg.max)
        return min(cfg.max, cfg.median * math.exp(self.rng.gauss(0.0, cfg.sigma)))

    async def wait(self) -> float:
        delay = self.sample()
        if delay > 0:
            await asyncio.sleep(delay)
        return delay
