"""What the dashboard draws beside ``/v1/status``: per policy the trainer's steps (wait,
step time, reward, how off-policy the batch was), the staleness of what it trained and
its held-out evaluations; per node the versions it holds and when each new version
reached it.

Kept in memory, bounded: a view of the run, not its record (the metric streams in the
run directory are that). A restarted data layer starts these series anew.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

#: points kept per series; a longer run keeps its latest ones
MAX_POINTS = 5000
#: points per series sent to the dashboard (evenly thinned, the last one always kept)
SHOWN_POINTS = 400
#: versions per policy whose refresh times are kept (the timeline's columns)
VERSIONS_KEPT = 64


def thinned(points: list[Any], most: int = SHOWN_POINTS) -> list[Any]:
    if len(points) <= most:
        return list(points)
    step = len(points) / most
    return [points[int(i * step)] for i in range(most - 1)] + [points[-1]]


class Timeline:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        #: per policy: [time, step, wait_seconds, step_seconds, reward_mean | None,
        #: ess_fraction | None, offpolicy_kl | None] (the batch's off-policy gauges)
        self.steps: dict[str, deque[list[Any]]] = {}
        #: per policy: Counter of trained samples by staleness (versions behind)
        self.staleness: dict[str, Counter[int]] = {}
        #: per policy: [time, version, {metric: value}]
        self.evals: dict[str, deque[list[Any]]] = {}
        #: per policy: {version: when it was published}
        self.published: dict[str, dict[int, float]] = {}
        #: per node: {policy: version} as its last lease said
        self.held: dict[str, dict[str, int]] = {}
        #: per (node, policy): {version: [reached at, seconds after its publication]}
        self.reached: dict[tuple[str, str], dict[int, list[float | None]]] = {}
        #: per node: trajectories accepted, and (time, count) samples for its rate
        self.accepted: Counter[str] = Counter()
        self._rate_marks: dict[str, deque[tuple[float, int]]] = {}

    def stepped(self, policy: str, wait: float, step: float, staleness: list[int],
                metrics: dict[str, float]) -> None:
        series = self.steps.setdefault(policy, deque(maxlen=MAX_POINTS))
        number = (series[-1][1] + 1) if series else 1
        series.append([self.clock(), number, wait, step, metrics.get("reward_mean"),
                       metrics.get("ess_fraction"), metrics.get("offpolicy_kl")])
        self.staleness.setdefault(policy, Counter()).update(max(0, s) for s in staleness)

    def evaluated(self, policy: str, version: int, metrics: dict[str, float]) -> None:
        self.evals.setdefault(policy, deque(maxlen=MAX_POINTS)).append(
            [self.clock(), version, metrics])

    def publish(self, policy: str, version: int) -> None:
        versions = self.published.setdefault(policy, {})
        versions.setdefault(version, self.clock())
        for old in sorted(versions)[:-VERSIONS_KEPT]:
            del versions[old]

    def lease(self, node_id: str, versions: dict[str, int]) -> None:
        """A node's lease says which version it holds of each policy: the first time a
        version shows, it reached the node."""
        now = self.clock()
        before = self.held.get(node_id, {})
        for policy, version in versions.items():
            if before.get(policy) == version:
                continue
            seen = self.reached.setdefault((node_id, policy), {})
            if version not in seen:
                published = self.published.get(policy, {}).get(version)
                seen[version] = [now, round(now - published, 3) if published else None]
                for old in sorted(seen)[:-VERSIONS_KEPT]:
                    del seen[old]
        self.held[node_id] = dict(versions)

    def accept(self, node_id: str | None, n: int) -> None:
        if node_id is None:
            return
        self.accepted[node_id] += n
        marks = self._rate_marks.setdefault(node_id, deque(maxlen=64))
        marks.append((self.clock(), self.accepted[node_id]))

    def forget_node(self, node_id: str) -> None:
        """A departed node no longer shows."""
        self.held.pop(node_id, None)
        self.accepted.pop(node_id, None)
        self._rate_marks.pop(node_id, None)
        for key in [k for k in self.reached if k[0] == node_id]:
            del self.reached[key]

    def rate(self, node_id: str, window: float = 60.0) -> float:
        """Trajectories per second the node delivered over the last ``window`` seconds."""
        marks = self._rate_marks.get(node_id)
        if not marks:
            return 0.0
        now = self.clock()
        recent = [m for m in marks if now - m[0] <= window]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0][0], 1e-6)
        return round((recent[-1][1] - recent[0][1]) / span, 3)

    def view(self, status: dict[str, Any]) -> dict[str, Any]:
        """``status`` with the series, as the dashboard reads it."""
        policies = {}
        for policy, info in status["policies"].items():
            steps = list(self.steps.get(policy, ()))
            waits = sum(s[2] for s in steps)
            busy = sum(s[3] for s in steps)
            policies[policy] = {
                **info,
                "steps": thinned(steps),
                "step_seconds_mean": round(busy / len(steps), 4) if steps else None,
                "wait_fraction": round(waits / busy, 4) if busy > 0 else None,
                "staleness_histogram": {str(k): v for k, v in
                                        sorted(self.staleness.get(policy, {}).items())},
                "evals": thinned(list(self.evals.get(policy, ()))),
                "published": {str(v): t for v, t in
                              sorted(self.published.get(policy, {}).items())},
            }
        nodes = []
        for node in status["nodes"]:
            node_id = node["node_id"]
            nodes.append({
                **node,
                "versions": self.held.get(node_id, {}),
                "accepted": self.accepted.get(node_id, 0),
                "throughput": self.rate(node_id),
                "refreshes": {policy: {str(v): r for v, r in sorted(seen.items())}
                              for (nid, policy), seen in self.reached.items()
                              if nid == node_id},
            })
        return {**status, "time": self.clock(), "policies": policies, "nodes": nodes}
