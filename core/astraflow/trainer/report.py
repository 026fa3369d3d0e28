"""What a trainer says of each step: the line it appends to ``metrics-<policy>.jsonl``.

A step's seconds run from when its wait for a batch began to when the trainer could
start the next step: a publish behind the next step is the publish's time, not the
step's (the data layer plans the rollouts it needs with the trainer's pace).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.rewards.base import reward_metric_means
from astraflow.types import Batch, TrainItem

#: the train metrics the dashboard shows beside the batch's mean reward
DASHBOARD_METRICS = ("loss", "entropy", "grad_norm", "ess_fraction", "offpolicy_kl")


@dataclass
class StepTimes:
    """One step's clock readings (``time.time()``)."""

    waited: float  # its wait for a batch began (the previous step ended)
    started: float = 0.0  # it began training
    trained: float = 0.0
    #: the next step could start while this one publishes (None: it publishes first)
    done: float | None = None
    checkpoint_seconds: float = 0.0
    steps_left: int = 0

    @property
    def wait_seconds(self) -> float:
        return self.started - self.waited


def reward_mean(batch: Batch) -> float:
    return sum(item.trajectory.reward for item in batch.items) / max(len(batch.items), 1)


def dashboard_metrics(batch: Batch, metrics: dict[str, float]) -> dict[str, float]:
    """What the acknowledgement carries to the data layer's dashboard."""
    return {"reward_mean": reward_mean(batch),
            **{k: v for k, v in metrics.items() if k in DASHBOARD_METRICS}}


class StepReport:
    """Appends a line per step to ``path`` (and, with ``record_batches``, each batch
    trained to ``batches-<policy>.jsonl`` beside it, to replay a step offline)."""

    def __init__(self, path: Path, policy: str, record_batches: bool) -> None:
        self.path, self.policy, self.record_batches = path, policy, record_batches

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        # the first step can come before anything else made the folder
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")

    def batch(self, step: int, batch: Batch) -> None:
        if self.record_batches:
            self._append(self.path.with_name(f"batches-{self.policy}.jsonl"),
                         {"step": step, **batch.to_dict()})

    def step(self, *, step: int, version: int, batch: Batch, metrics: dict[str, float],
             times: StepTimes, published: float, acked: float,
             ledger: dict[str, Any]) -> None:
        """Log a step published from ``published`` to ``acked`` (its acknowledgement
        answered with the data layer's ``ledger``)."""
        staleness = [version - 1 - item.trajectory.min_version for item in batch.items]
        outcomes = [item.trajectory.outcome for item in batch.items]
        self._append(self.path, {
            **{f"train/{k}": float(v) for k, v in metrics.items()},
            "kind": "train", "policy": self.policy, "step": step,
            "version": version, "time": acked, "batch_id": batch.batch_id,
            "reward_mean": reward_mean(batch),
            "batch_size": len(batch.items), "wait_seconds": times.wait_seconds,
            "step_seconds": (times.done or acked) - times.started,
            "staleness_max": max(staleness, default=0),
            "train_seconds": times.trained - times.started,
            "publish_seconds": acked - published,
            "checkpoint_seconds": times.checkpoint_seconds,
            # every rollout this policy's nodes produced so far, kept or not
            "generated": ledger["generated"],
            # of what the nodes generated and is not still waiting in the buffer
            "trained_fraction": ledger["trained_fraction"],
            **_pools(batch.items, ledger),
            # samples whose reward raised or timed out (zero advantage), in this batch
            # and run so far, and the extra metrics a reward returned, batch means
            "reward_failed": sum(o.failed for o in outcomes),
            "reward_failed_total": ledger.get("reward_failed", 0),
            # over-provisioned groups: samples cancelled on the nodes, run so far (never
            # trained, not generated trajectories), and this batch's audited groups
            "cancelled_total": ledger.get("cancelled", 0),
            **overprovision_metrics(batch.items),
            **reward_metric_means(outcomes),
        })


def _pools(items: list[TrainItem], ledger: dict[str, Any]) -> dict[str, int]:
    """Which rollout pools fed this step (heterogeneous and remote pools show here),
    and, run so far, how many each pool's lag cost (dropped as too stale)."""
    pools = Counter(str(item.trajectory.metadata.get("pool", "unknown")) for item in items)
    return {**{f"pool/{name}": n for name, n in sorted(pools.items())},
            **{f"dropped_stale/{name}": n for name, n
               in sorted(ledger.get("dropped_stale_by_pool", {}).items())}}


def overprovision_metrics(items: list[TrainItem]) -> dict[str, float]:
    """A batch's over-provisioned groups (see :mod:`astraflow.workflows.groups`): the
    samples cancelled in its groups, and over its audited groups the kept samples' mean
    reward against the cancelled-to-be ones' -- the bias of cutting the tail, where how
    long a sample takes depends on what was written."""
    groups: dict[str, dict[str, Any]] = {}
    for item in items:
        traj = item.trajectory
        groups.setdefault(traj.group_id, traj.metadata)
    cancelled = [int(m["cancelled"]) for m in groups.values() if m.get("cancelled") is not None]
    if not cancelled:
        return {}
    out = {"overprovision/cancelled": float(sum(cancelled))}
    audited = [m for m in groups.values() if "audit_cancelled_reward" in m]
    if audited:
        out["overprovision/audited_groups"] = float(len(audited))
        out["overprovision/kept_reward"] = sum(
            m["audit_kept_reward"] for m in audited) / len(audited)
        out["overprovision/cancelled_reward"] = sum(
            m["audit_cancelled_reward"] for m in audited) / len(audited)
    return out
