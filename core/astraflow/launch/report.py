"""What a finished run leaves behind: metrics.jsonl, a plot and summary.json (the
loggers, TensorBoard by default, wrote their files while it ran)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from astraflow.components import policy_names
from astraflow.launch.metrics import by_policy, read_records


def write_report(cfg: DictConfig, run_dir: Path, status: dict[str, Any],
                 wall_seconds: float, started: float | None = None) -> dict[str, Any]:
    """``started``: when the launcher started (epoch seconds), for the start-up cost."""
    records = read_records(run_dir)
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    train, evals = by_policy(records, "train"), by_policy(records, "eval")
    refreshes = by_policy(records, "refresh")
    _plot(run_dir, train, evals)
    counts = status.get("policies", {})
    summary: dict[str, Any] = {"run_dir": str(run_dir), "wall_seconds": wall_seconds,
                               "started_at": started, "policies": {}}
    for policy in policy_names(cfg):
        ev = sorted(evals.get(policy, []), key=lambda r: r["version"])
        tr = train.get(policy, [])
        summary["policies"][policy] = {
            "start_eval_accuracy": ev[0]["eval_accuracy"] if ev else None,
            "final_eval_accuracy": ev[-1]["eval_accuracy"] if ev else None,
            "start_eval_greedy_accuracy": ev[0]["eval_greedy_accuracy"] if ev else None,
            "final_eval_greedy_accuracy": ev[-1]["eval_greedy_accuracy"] if ev else None,
            "final_version": ev[-1]["version"] if ev else None,
            "steps": max((r["step"] for r in tr), default=0),
            "trajectories_generated": counts.get(policy, {}).get("generated", 0),
            "trajectories_trained": sum(r["batch_size"] for r in tr),
            # trained / generated, leaving out what was still buffered at the end
            # (reported as trajectories_left_over)
            "trained_fraction": counts.get(policy, {}).get("trained_fraction"),
            "trajectories_left_over": counts.get(policy, {}).get("pending", 0),
            # the rest of the ledger: generated = trained + left over + these
            "trajectories_dropped": {
                "stale": counts.get(policy, {}).get("dropped_stale", 0),
                "no_trainer": counts.get(policy, {}).get("dropped_no_trainer", 0),
                "filtered": counts.get(policy, {}).get("filtered", 0)},
            # over-provisioned groups' samples cancelled on the nodes: not generated
            # trajectories (outside the ledger above); each cost a generation and an
            # environment call that was abandoned
            "samples_cancelled": counts.get(policy, {}).get("cancelled", 0),
            "by_pool": counts.get(policy, {}).get("by_pool", {}),
            "trainer_wait_fraction": _wait_fraction(tr),
            # why leases were refused, by kind (staleness, turnaround, refresh_first...):
            # where a trainer that waited for data should look first
            "admission_refusals": counts.get(policy, {}).get("admission_refusals", {}),
            "wall_seconds": wall_seconds,
            # what start-up costs: from the launcher's start to the end of step 1
            "first_step_seconds": (min(r["time"] for r in tr) - started
                                   if tr and started is not None else None),
            # ... and until its first trajectory was accepted
            "first_trajectory_seconds": _since(counts.get(policy, {}).get("first_accepted_at"),
                                               started),
            "refresh": _refresh_summary(refreshes.get(policy, [])),
        }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _since(at: float | None, started: float | None) -> float | None:
    return None if at is None or started is None else round(at - started, 3)


def _refresh_summary(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """How soon new weights served on the nodes: seconds from each version's publication
    to a node serving it (mean, 90th percentile, max) and seconds each load took."""
    delays = sorted(r["since_published"] for r in loads
                    if r.get("since_published") is not None and r["version"] > 0)
    took = [r["load_seconds"] for r in loads if r["version"] > 0]
    drained = [r["drain_seconds"] for r in loads
               if r["version"] > 0 and r.get("drain_seconds") is not None]
    if not delays:
        return {"loads": len(took)}
    out = {"loads": len(took),
           "since_published_mean": round(sum(delays) / len(delays), 4),
           "since_published_p90": delays[min(len(delays) - 1, int(0.9 * len(delays)))],
           "since_published_max": delays[-1],
           "load_seconds_mean": round(sum(took) / len(took), 4)}
    if drained:  # of the load, waiting for the generations in flight to finish
        out["drain_seconds_mean"] = round(sum(drained) / len(drained), 4)
    return out


def _wait_fraction(train: list[dict[str, Any]]) -> float | None:
    """Share of the trainer's time spent waiting for a batch, over the whole run."""
    wait = sum(r.get("wait_seconds", 0.0) for r in train)
    busy = sum(r.get("step_seconds", 0.0) for r in train)
    return round(wait / (wait + busy), 4) if wait + busy > 0 else None


def _plot(run_dir: Path, train: dict[str, Any], evals: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    for policy, recs in train.items():
        ax_r.plot([r["step"] for r in recs], [r["reward_mean"] for r in recs], label=policy)
    for policy, recs in evals.items():
        recs = sorted(recs, key=lambda r: r["version"])
        ax_e.plot([r["version"] for r in recs], [r["eval_accuracy"] for r in recs],
                  marker="o", label=f"{policy} (sampled)")
        ax_e.plot([r["version"] for r in recs], [r["eval_greedy_accuracy"] for r in recs],
                  marker=".", linestyle="--", label=f"{policy} (greedy)")
    ax_r.set(title="training reward (batch mean)", xlabel="step", ylabel="reward")
    ax_e.set(title="held-out accuracy", xlabel="policy version", ylabel="accuracy",
             ylim=(0, 1))
    for ax in (ax_r, ax_e):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no evaluator (no held-out split): no curve
            ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "reward.png", dpi=100)
    plt.close(fig)
