"""Observability: /v1/status, the autoscale report and Prometheus metrics.

A part of :class:`~astraflow.dataflow.service.DataflowService`: the state it reads and
writes is set up there.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from astraflow.dataflow.records import (
    prom_label,
    share,
)
from astraflow.dataflow.state import ServiceState


class ObservabilityMixin(ServiceState):
    """Mixed into DataflowService (see the module's docstring)."""

    def pool_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for node in self.nodes.values():
            if node.kind == "raas" and node.state == "active":
                pool = node.labels.get("pool", "default")
                sizes[pool] = sizes.get(pool, 0) + 1
        return sizes

    def by_pool(self, event: str) -> dict[str, dict[str, int]]:
        """A per-(policy, pool) counter: produced, consumed or dropped_stale samples."""
        prefix = f"{event}_pool:"
        out: dict[str, dict[str, int]] = {p: {} for p in self.policies}
        for name, n in self.counters.items():
            if name.startswith(prefix) and n:
                policy, pool = json.loads(name[len(prefix):])
                if policy in out:
                    out[policy][pool] = n
        return out

    def stale_by_pool(self) -> dict[str, dict[str, int]]:
        """Stale drops per policy and rollout pool: which pool lags too far behind."""
        return self.by_pool("dropped_stale")

    def ledger(self, policy: str) -> dict[str, Any]:
        """What a trainer records of its policy after each step (the acknowledgement's
        reply carries it): cheaper than the whole status, which scans every task."""
        stale = self.stale_by_pool()[policy]
        produced = self.by_pool("produced")[policy]
        consumed = self.by_pool("consumed")[policy]
        got = self._yield(policy, produced, consumed, stale)
        return {"generated": got["generated"], "trained_fraction": got["trained_fraction"],
                "dropped_stale_by_pool": stale,
                "reward_failed": self.counters[f"reward_failed:{policy}"]}

    def _yield(self, policy: str, produced: dict[str, int], consumed: dict[str, int],
               stale: dict[str, int]) -> dict[str, Any]:
        """How much of what the nodes generated for ``policy`` was trained on, in all
        and per rollout pool. What is still buffered or in a batch being trained on is
        left out of the fraction (it may yet be trained on) and reported as pending."""
        c = self.counters
        waiting = Counter(item.pool for item in self.fresh[policy].values())
        waiting.update(item.pool for item in self.in_batches.values() if item.policy == policy)
        pending = sum(waiting.values())
        generated, trained = c[f"produced:{policy}"], c[f"consumed:{policy}"]
        return {
            "generated": generated,
            "trained": trained,
            "pending": pending,
            "trained_fraction": share(trained, generated - pending),
            "by_pool": {
                pool: {"generated": produced.get(pool, 0), "trained": consumed.get(pool, 0),
                       "dropped_stale": stale.get(pool, 0),
                       "pending": waiting[pool],
                       "trained_fraction": share(consumed.get(pool, 0),
                                                     produced.get(pool, 0) - waiting[pool])}
                for pool in sorted(set(produced) | set(consumed))
            },
        }

    def status(self) -> dict[str, Any]:
        c = self.counters
        now = time.monotonic()
        stale_by_pool = self.stale_by_pool()
        produced, consumed = self.by_pool("produced"), self.by_pool("consumed")
        leased = Counter(r.node_id for r in self.tasks.values() if r.state == "leased")
        nodes = [
            {
                "node_id": n.node_id,
                "kind": n.kind,
                "state": n.state,
                "labels": n.labels,
                "seconds_since_heartbeat": round(now - n.last_seen, 3),
                **({"in_flight": leased[n.node_id],
                    "turnaround_seconds": self.pacing.turnaround(n.node_id)}
                   if n.kind == "raas" else {}),
            }
            for n in self.nodes.values()
        ]
        pools: dict[str, dict[str, Any]] = {}
        for n in self.nodes.values():
            if n.kind == "raas" and n.state == "active":
                pool = pools.setdefault(n.labels.get("pool", "default"),
                                        {"nodes": 0, "capacity": 0, "regions": []})
                pool["nodes"] += 1
                pool["capacity"] += n.labels.get("capacity", 1)
                if n.labels.get("region") not in pool["regions"]:
                    pool["regions"].append(n.labels.get("region"))
        policies = {
            p: {
                "version": self.versions[p],
                "max_staleness": m,
                "buffered": len(self.fresh[p]),
                "replayable": len(self.replayable[p]),
                "outstanding_batches": len(self._held(p)),
                "trainer_gone": self._orphaned(p),
                "dropped_stale_by_pool": stale_by_pool[p],
                **{
                    name: c[f"{name}:{p}"]
                    for name in ("accepted", "filtered", "consumed", "dropped_stale",
                                 "dropped_no_trainer", "replayed", "lost", "produced",
                                 "reward_failed")
                },
                "first_reward_error": self.reward_errors.get(p),
                "first_accepted_at": self.first_accepted.get(p),
                "admission_refusals": dict(self.refusals[p]),
                **self._yield(p, produced[p], consumed[p], stale_by_pool[p]),
            }
            for p, m in self.policies.items()
        }
        return {
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "order": self.settings.order,
            "nodes": nodes,
            "pools": pools,
            "policies": policies,
            "versions": dict(self.versions),
            "tasks": {
                "issued": c["tasks_issued"],
                "leased": c["tasks_leased"],
                "completed": c["tasks_completed"],
                "reissued": c["tasks_reissued"],
                "posted": c["tasks_posted"],
                "skipped": c["tasks_skipped"],
                "in_flight": sum(1 for r in self.tasks.values() if r.state == "leased"),
                "pending": sum(1 for r in self.tasks.values() if r.state == "pending"),
                "duplicate_submissions": c["submissions_duplicate"],
                "epoch": self.epoch,
            },
            "trajectories": {
                name: sum(c[f"{name}:{p}"] for p in self.policies)
                for name in ("accepted", "filtered", "consumed", "dropped_stale",
                                 "dropped_no_trainer", "replayed", "lost")
            },
            "store": {"wal_frames_pending": self.store.wal_frames_pending,
                      "payload_log": self.store.payloads.stats()},
            "source": self.source.stats() if self.source is not None else {},
        }

    def autoscale_report(self) -> dict[str, Any]:
        return self.autoscale.report(self.pool_sizes())

    def metrics(self) -> str:
        """Prometheus text exposition of the counters and gauges in ``status``."""
        st = self.status()
        lines = [
            "# HELP astraflow_tasks_total Task ledger events.",
            "# TYPE astraflow_tasks_total counter",
        ]
        for event in ("issued", "leased", "completed", "reissued", "posted", "skipped"):
            lines.append(f'astraflow_tasks_total{{event="{event}"}} {st["tasks"][event]}')
        lines += ["# HELP astraflow_trajectories_total Trajectory events per policy.",
                  "# TYPE astraflow_trajectories_total counter"]
        gauges: list[str] = []
        for policy, info in st["policies"].items():
            p = prom_label(policy)
            for event in ("accepted", "filtered", "consumed", "dropped_stale",
                          "dropped_no_trainer", "replayed", "lost"):
                lines.append(
                    f'astraflow_trajectories_total{{policy="{p}",event="{event}"}} {info[event]}'
                )
            gauges.append(f'astraflow_policy_version{{policy="{p}"}} {info["version"]}')
            gauges.append(f'astraflow_buffer_size{{policy="{p}"}} {info["buffered"]}')
        lines += ["# HELP astraflow_policy_version Latest weight version per policy.",
                  "# TYPE astraflow_policy_version gauge",
                  *[g for g in gauges if g.startswith("astraflow_policy_version")],
                  "# HELP astraflow_buffer_size Fresh trajectories buffered per policy.",
                  "# TYPE astraflow_buffer_size gauge",
                  *[g for g in gauges if g.startswith("astraflow_buffer_size")],
                  "# HELP astraflow_tasks_in_flight Tasks currently leased.",
                  "# TYPE astraflow_tasks_in_flight gauge",
                  f"astraflow_tasks_in_flight {st['tasks']['in_flight']}",
                  "# HELP astraflow_pool_nodes Active rollout nodes per pool.",
                  "# TYPE astraflow_pool_nodes gauge"]
        for pool, info in st["pools"].items():
            lines.append(f'astraflow_pool_nodes{{pool="{prom_label(pool)}"}} {info["nodes"]}')
        lines += ["# HELP astraflow_dropped_stale_total Stale trajectories dropped per policy "
                  "and the rollout pool that produced them.",
                  "# TYPE astraflow_dropped_stale_total counter"]
        for policy, info in st["policies"].items():
            for pool, n in sorted(info["dropped_stale_by_pool"].items()):
                lines.append(f'astraflow_dropped_stale_total{{policy="{prom_label(policy)}",'
                             f'pool="{prom_label(pool)}"}} {n}')
        return "\n".join(lines) + "\n"
