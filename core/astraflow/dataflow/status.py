"""The status view: /v1/status, the ledger a trainer records after each step, the
autoscale report and Prometheus metrics, read from the collaborators that own the
state (the view owns none).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.intake import Intake
from astraflow.dataflow.leasing import Leasing
from astraflow.dataflow.ledger import Ledger
from astraflow.dataflow.nodes import Nodes
from astraflow.dataflow.overload import Overload
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.records import prom_label, share
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.store import Store
from astraflow.dataflow.tasks import TaskQueue
from astraflow.dataflow.versions import Versions

#: per-policy trajectory events, as counted (``<event>:<policy>``)
EVENTS = ("accepted", "filtered", "consumed", "dropped_stale", "dropped_no_trainer",
          "replayed", "lost")
TASK_EVENTS = ("issued", "leased", "completed", "reissued", "posted", "skipped")


class StatusView:
    def __init__(self, intake: Intake, leasing: Leasing, *, settings: DataflowSettings,
                 store: Store, tasks: TaskQueue, ledger: Ledger, nodes: Nodes, versions: Versions,
                 pacing: Pacing, autoscale: AutoscaleWindow, overload: Overload) -> None:
        self._settings = settings
        self._store = store
        self._tasks = tasks
        self._ledger = ledger
        self._nodes = nodes
        self._versions = versions
        self._pacing = pacing
        self._autoscale = autoscale
        self._overload = overload
        self._intake, self._leasing = intake, leasing
        self.started_at = time.time()

    def by_pool(self, event: str) -> dict[str, dict[str, int]]:
        """A per-(policy, pool) counter: produced, consumed or dropped_stale samples."""
        prefix = f"{event}_pool:"
        out: dict[str, dict[str, int]] = {p: {} for p in self._versions.policies}
        for name, n in self._store.counters.items():
            if name.startswith(prefix) and n:
                policy, pool = json.loads(name[len(prefix):])
                if policy in out:
                    out[policy][pool] = n
        return out

    def ledger(self, policy: str) -> dict[str, Any]:
        """What a trainer records of its policy after each step (the acknowledgement's
        reply carries it): cheaper than the whole status, which scans every task."""
        stale = self.by_pool("dropped_stale")[policy]
        got = self._yield(policy, self.by_pool("produced")[policy],
                          self.by_pool("consumed")[policy], stale)
        return {"generated": got["generated"], "trained_fraction": got["trained_fraction"],
                "dropped_stale_by_pool": stale,
                "reward_failed": self._store.counters[f"reward_failed:{policy}"],
                "cancelled": self._store.counters[f"cancelled:{policy}"]}

    def _yield(self, policy: str, produced: dict[str, int], consumed: dict[str, int],
               stale: dict[str, int]) -> dict[str, Any]:
        """How much of what the nodes generated for ``policy`` was trained on, in all
        and per rollout pool. What is still buffered or in a batch being trained on is
        left out of the fraction (it may yet be trained on) and reported as pending."""
        c = self._store.counters
        waiting = self._ledger.waiting_per_pool(policy)
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
        c = self._store.counters
        store = self._store
        return {
            "uptime_seconds": round(time.time() - self.started_at, 3),
            # times the data layer did not run for a while (stopped, or its machine
            # stalled): node heartbeats and lease deadlines were extended by as much
            "stalls": c["stalls"],
            "order": self._settings.order,
            # load shedding: new leases refused while the event loop cannot keep up
            "overload": {"shedding": self._overload.shedding,
                         "lag_ms": round(self._overload.lag * 1e3, 1),
                         "retry_after": round(self._overload.retry, 2),
                         "lease_cap": None if math.isinf(self._overload.cap)
                         else int(self._overload.cap),
                         "leases_shed": self._overload.shed},
            "nodes": self._node_rows(),
            "pools": self._pools(),
            "policies": self._policies(),
            "versions": self._versions.all(),
            "tasks": {
                **{event: c[f"tasks_{event}"] for event in TASK_EVENTS},
                "in_flight": self._tasks.in_flight(),
                "pending": self._tasks.pending(),
                "duplicate_submissions": c["submissions_duplicate"],
                "epoch": self._tasks.epoch,
            },
            "trajectories": {name: sum(c[f"{name}:{policy}"] for policy in self._versions.policies)
                             for name in EVENTS},
            "store": {"wal_frames_pending": store.wal_frames_pending,
                      "payload_log": store.payloads.stats(),
                      **store.sizes()},
            "retention": {"seconds": self._settings.retain_seconds,
                          "tasks_remembered": self._tasks.done_count(),
                          "batches_remembered": self._ledger.acked_count(),
                          **{f"{what}_forgotten": c[f"{what}_forgotten"]
                             for what in ("tasks", "batches", "nodes")}},
            "source": self._tasks.source.stats() if self._tasks.source is not None else {},
        }

    def _node_rows(self) -> list[dict[str, Any]]:
        leased = self._tasks.leased_per_node()
        return [
            {**summary, **({"in_flight": leased[summary["node_id"]],
                            "turnaround_seconds": self._pacing.turnaround(summary["node_id"])}
                           if summary["kind"] == "raas" else {})}
            for summary in self._nodes.summary()
        ]

    def _pools(self) -> dict[str, dict[str, Any]]:
        pools: dict[str, dict[str, Any]] = {}
        for n in self._nodes.rollout_nodes():
            pool = pools.setdefault(n.labels.get("pool", "default"),
                                    {"nodes": 0, "capacity": 0, "regions": []})
            pool["nodes"] += 1
            pool["capacity"] += n.labels.get("capacity", 1)
            if n.labels.get("region") not in pool["regions"]:
                pool["regions"].append(n.labels.get("region"))
        return pools

    def _policies(self) -> dict[str, dict[str, Any]]:
        c = self._store.counters
        stale = self.by_pool("dropped_stale")
        produced, consumed = self.by_pool("produced"), self.by_pool("consumed")
        return {
            policy: {
                "version": self._versions[policy],
                "max_staleness": self._versions.max_staleness(policy),
                "max_staleness_why": self._versions.staleness_reason(policy),
                "buffered": self._ledger.buffered(policy),
                "replayable": self._ledger.replayable(policy),
                "outstanding_batches": len(self._ledger.held(policy)),
                "trainer_gone": self._nodes.orphaned(policy),
                "dropped_stale_by_pool": stale[policy],
                **{name: c[f"{name}:{policy}"]
                   for name in (*EVENTS, "produced", "reward_failed", "cancelled")},
                "first_reward_error": self._intake.reward_errors.get(policy),
                "first_accepted_at": self._intake.first_accepted.get(policy),
                "admission_refusals": dict(self._leasing.refusals[policy]),
                **self._yield(policy, produced[policy], consumed[policy], stale[policy]),
            }
            for policy in self._versions.policies
        }

    def autoscale_report(self) -> dict[str, Any]:
        return self._autoscale.report(self._nodes.pool_sizes())

    def metrics(self) -> str:
        """Prometheus text exposition of the counters and gauges in ``status``."""
        st = self.status()
        lines = ["# HELP astraflow_tasks_total Task ledger events.",
                 "# TYPE astraflow_tasks_total counter"]
        lines += [f'astraflow_tasks_total{{event="{event}"}} {st["tasks"][event]}'
                  for event in TASK_EVENTS]
        lines += ["# HELP astraflow_trajectories_total Trajectory events per policy.",
                  "# TYPE astraflow_trajectories_total counter"]
        versions, buffers, stale = [], [], []
        for policy, info in st["policies"].items():
            label = prom_label(policy)
            lines += [f'astraflow_trajectories_total{{policy="{label}",event="{event}"}} '
                      f'{info[event]}' for event in EVENTS]
            versions.append(f'astraflow_policy_version{{policy="{label}"}} {info["version"]}')
            buffers.append(f'astraflow_buffer_size{{policy="{label}"}} {info["buffered"]}')
            stale += [f'astraflow_dropped_stale_total{{policy="{label}",'
                      f'pool="{prom_label(pool)}"}} {n}'
                      for pool, n in sorted(info["dropped_stale_by_pool"].items())]
        lines += ["# HELP astraflow_policy_version Latest weight version per policy.",
                  "# TYPE astraflow_policy_version gauge", *versions,
                  "# HELP astraflow_buffer_size Fresh trajectories buffered per policy.",
                  "# TYPE astraflow_buffer_size gauge", *buffers,
                  "# HELP astraflow_tasks_in_flight Tasks currently leased.",
                  "# TYPE astraflow_tasks_in_flight gauge",
                  f"astraflow_tasks_in_flight {st['tasks']['in_flight']}",
                  "# HELP astraflow_pool_nodes Active rollout nodes per pool.",
                  "# TYPE astraflow_pool_nodes gauge"]
        lines += [f'astraflow_pool_nodes{{pool="{prom_label(pool)}"}} {info["nodes"]}'
                  for pool, info in st["pools"].items()]
        lines += ["# HELP astraflow_dropped_stale_total Stale trajectories dropped per policy "
                  "and the rollout pool that produced them.",
                  "# TYPE astraflow_dropped_stale_total counter", *stale]
        return "\n".join(lines) + "\n"
