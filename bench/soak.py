"""The data layer alone under sustained load: does it stay flat?

Starts ``astraflow dataflow`` (a real uvicorn process over a real SQLite store) with two
policies, then runs simulated rollout nodes -- client processes that lease a task and
submit a group for each policy -- and one trainer stand-in per policy that pulls and
acknowledges batches.
The nodes pace themselves to ``--rate`` trajectories per second (default: ten times the
default run's ingest, 2,150/s, measured on this machine). Where the data layer cannot
take that (two cores shared with the nodes do not), they are paced from half-way through
the warm-up at ``--steady`` (0.85) of what it sustained until then: a saturated server's
throughput drifts with the machine, what retention holds drifts with it, and growth in
memory or store would then measure the drift, not a leak.

Every ``--sample`` seconds it records the server's resident memory, the store's size
(database and payload log) and what the server remembers; every lease and submission's
latency is recorded by the node that made it. After a warm-up (long enough for
``--retain-seconds`` to start forgetting), it checks:

* resident memory growth from the end of the warm-up to the end: <= 5%;
* p99 lease and submit latency in the last tenth of the run <= 1.2x the first tenth
  after the warm-up;
* the data layer's CPU time per trajectory accepted, in the same two windows: <= 1.2x
  (work that grows with what was done shows here even where neighbours on the machine
  move the latencies);
* the store bounded: its database at the end <= 1.2x its size at the end of the
  warm-up, its payload log never past two segments (the one being appended to and one
  sealed, reclaimed once its trajectories are trained).

    python bench/soak.py --minutes 60 --out bench/results/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from astraflow.dataflow.payloads import SEGMENT_BYTES

TOKEN = "bench-soak-token"
POLICIES = ("solver", "verifier")
GROUP_SIZE = 4
BATCH = 64
#: the default run's ingest on this machine (153,856 trajectories in 71.4 s, AMD EPYC,
#: 2 cores): the soak's default rate is ten times it
DEFAULT_RUN_INGEST = 2150.0


_GROUPS: dict[int, list[dict[str, Any]]] = {}
#: tasks per second per slot, set by the driver once it has seen what the data layer
#: sustains (0 until then: the nodes run at the rate they were started with)
_PACE: Any = None


def _share_pace(pace: Any) -> None:
    global _PACE
    _PACE = pace


def _group(task_id: str, tokens: int) -> list[dict[str, Any]]:
    """A group of each policy for one task, arrays as binary blobs (made once)."""
    if tokens not in _GROUPS:
        _GROUPS[tokens] = _make_group(tokens)
    return [{**t, "task_id": task_id, "group_id": f"{task_id}/{t['policy']}"}
            for t in _GROUPS[tokens]]


def _make_group(tokens: int) -> list[dict[str, Any]]:
    task_id = "t"
    prompt = tokens // 2
    mask = np.r_[np.zeros(prompt), np.ones(tokens - prompt)].astype(np.uint8).tobytes()
    versions = np.where(np.r_[np.zeros(prompt), np.ones(tokens - prompt)] == 1, 0,
                        -1).astype("<i4").tobytes()
    out = []
    for policy in POLICIES:
        for k in range(GROUP_SIZE):
            out.append({
                "task_id": task_id, "group_id": f"{task_id}/{policy}", "policy": policy,
                "tokens": np.arange(1, tokens + 1, dtype="<i4").tobytes(),
                "logprobs": np.full(tokens, -0.5, dtype="<f4").tobytes(),
                "loss_mask": mask, "versions": versions,
                "spans": [{"start": 0, "end": prompt, "source": "prompt", "version": -1},
                          {"start": prompt, "end": tokens, "source": policy, "version": 0}],
                "reward": float(k % 2), "metadata": {"sample": k}})
    return out


async def _node_loop(client: Any, stop: float, pace: float, tokens: int,
                     lat: dict[str, list[tuple[float, float]]]) -> int:
    """One rollout slot: lease a task, submit its groups, at ``pace`` tasks per second
    (each its own request, so both latencies are measured)."""
    done = base = 0
    t0 = time.monotonic()
    while time.monotonic() < stop:
        start = time.monotonic()
        leases = await client.lease_tasks(max_tasks=1)
        lat["lease"].append((start, time.monotonic() - start))
        if not leases:
            await asyncio.sleep(0.05)
            continue
        start = time.monotonic()
        out = await client.submit(leases[0], _group(leases[0].task.task_id, tokens))
        lat["submit"].append((start, time.monotonic() - start))
        done += out.get("accepted", 0)
        if _PACE is not None and _PACE.value > 0 and _PACE.value != pace:
            # the driver settled the rate at what the data layer sustains: paced from now
            pace, t0, base = _PACE.value, time.monotonic(), done
        due = t0 + ((done - base) / (2 * GROUP_SIZE)) / pace  # never faster than the rate
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > 1.0:
            # behind (the server or the machine stalled): on at the rate from here, not a
            # burst to make up the schedule, which would raise what retention holds
            t0, base = now, done
    return done


async def _nodes(url: str, seconds: float, slots: int, pace: float, tokens: int
                 ) -> tuple[int, dict[str, list[tuple[float, float]]]]:
    from astraflow.dataflow.client import AsyncDataflowClient

    lat: dict[str, list[tuple[float, float]]] = {"lease": [], "submit": []}
    async with AsyncDataflowClient(url, TOKEN) as client:
        await client.register("raas", pool="soak")

        async def beat() -> None:
            while time.monotonic() < stop:
                await client.heartbeat()
                await asyncio.sleep(2.0)

        stop = time.monotonic() + seconds
        done = await asyncio.gather(beat(), *(_node_loop(client, stop, pace, tokens, lat)
                                              for _ in range(slots)))
    # wall-clock times, comparable across processes
    shift = time.time() - time.monotonic()
    return sum(d for d in done if d), {k: [(t + shift, s) for t, s in v]
                                       for k, v in lat.items()}


def _node_process(args: tuple) -> tuple[int, dict[str, list[tuple[float, float]]]]:
    return asyncio.run(_nodes(*args))


def _trainer_process(args: tuple) -> int:
    from astraflow.dataflow.client import DataflowClient

    url, policy, seconds = args
    trained = 0
    with DataflowClient(url, TOKEN) as client:
        client.register("trainer", policies=[policy])
        stop = time.monotonic() + seconds
        beat = 0.0
        while time.monotonic() < stop:
            if time.monotonic() - beat > 2.0:  # a trainer that stops beating is retired
                client.heartbeat()
                beat = time.monotonic()
            batch = client.get_batch(policy, BATCH, timeout=1.0, trainer_id=f"t-{policy}")
            if batch is not None:
                client.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=0.01)
                trained += len(batch.items)
    return trained


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _percentile(lat: list[tuple[float, float]], start: float, end: float, q: float
                ) -> float | None:
    window = [s for t, s in lat if start <= t < end]
    return float(np.percentile(window, q)) * 1000 if len(window) >= 20 else None


def _cpu_per_trajectory(samples: list[dict[str, Any]], start: float, end: float
                        ) -> float | None:
    """The data layer's CPU milliseconds per trajectory accepted between the samples
    that bound [start, end] (seconds since the start)."""
    inside = [s for s in samples if start <= s["t"] <= end]
    if len(inside) < 2 or inside[-1]["accepted"] <= inside[0]["accepted"]:
        return None
    return ((inside[-1]["cpu_s"] - inside[0]["cpu_s"]) * 1000
            / (inside[-1]["accepted"] - inside[0]["accepted"]))


def start_server(store: Path, retain: float) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "astraflow", "dataflow", "--port", "0", "--store", str(store),
            "--task", "arithmetic", "--group-size", str(GROUP_SIZE), "--batch-size", str(BATCH),
            "--buffer-capacity", "1000000", "--lease-seconds", "600",
            "--retain-seconds", str(retain)]
    for policy in POLICIES:
        args += ["--policy", f"{policy}=1000000"]
    server = subprocess.Popen(args, env={**os.environ, "ASTRAFLOW_TOKEN": TOKEN},
                              stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (store / "url").exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the data layer did not start")
        time.sleep(0.05)
    return server, (store / "url").read_text().strip()


def soak(seconds: float, rate: float, retain: float, warmup: float, sample: float,
         clients: int, slots: int, tokens: int, window: float = 0.1,
         steady: float | None = 0.85) -> dict[str, Any]:
    """Run the soak and return its figures and checks (see the module's docstring):
    the first and last ``window`` of the time after the warm-up are compared.
    With ``steady``, the nodes are paced from half-way through the warm-up at that
    fraction of what the data layer sustained until then, if below ``rate``: a load the
    server keeps up with, so what retention holds stays level and growth means a leak,
    not a machine whose spare capacity drifted (``None``: ``rate`` throughout)."""
    from astraflow.dataflow.client import DataflowClient

    store = Path(tempfile.mkdtemp(prefix="astraflow-soak-")) / "store"
    server, url = start_server(store, retain)
    samples: list[dict[str, Any]] = []
    try:
        ctx = mp.get_context("spawn")
        pace = rate / (2 * GROUP_SIZE) / (clients * slots)  # tasks/s per slot
        shared = ctx.Value("d", 0.0, lock=False)
        with ctx.Pool(clients + len(POLICIES), initializer=_share_pace,
                      initargs=(shared,)) as pool, DataflowClient(url, TOKEN) as probe:
            began = time.time()
            settled: float | None = None
            nodes = pool.map_async(_node_process, [(url, seconds, slots, pace, tokens)] * clients)
            trainers = pool.map_async(_trainer_process,
                                      [(url, p, seconds + 5) for p in POLICIES])
            while not nodes.ready():
                st = probe.status()
                samples.append({
                    "t": round(time.time() - began, 1), "rss_mb": round(_rss_mb(server.pid), 1),
                    "cpu_s": _cpu_seconds(server.pid),
                    "database_bytes": st["store"]["database_bytes"],
                    "wal_bytes": st["store"]["wal_bytes"],
                    "payload_bytes": st["store"]["payload_log"]["bytes"],
                    "remembered": st["retention"]["tasks_remembered"],
                    "accepted": st["trajectories"]["accepted"],
                    "buffered": sum(p["buffered"] for p in st["policies"].values())})
                if steady and settled is None and samples[-1]["t"] >= warmup / 2:
                    settled = _settle(samples, rate, steady)
                    shared.value = settled / (2 * GROUP_SIZE) / (clients * slots)
                nodes.wait(sample)
            results = nodes.get()
            trained = sum(trainers.get())
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(store.parent, ignore_errors=True)
    result = _report(samples, results, trained, began, seconds, warmup, settled or rate,
                     window)
    return {"asked_trajectories_per_s": rate, **result}


def _rate(samples: list[dict[str, Any]], start: float, end: float) -> float | None:
    inside = [s for s in samples if start <= s["t"] <= end]
    if len(inside) < 2:
        return None
    return round((inside[-1]["accepted"] - inside[0]["accepted"])
                 / (inside[-1]["t"] - inside[0]["t"]), 1)


def _settle(samples: list[dict[str, Any]], rate: float, fraction: float) -> float:
    """The rate to hold from now: ``fraction`` of the trajectories/s accepted over the
    second half of what has run so far, or ``rate`` if that is lower."""
    last = samples[-1]
    mid = min(samples, key=lambda s: abs(s["t"] - last["t"] / 2))
    sustained = (last["accepted"] - mid["accepted"]) / max(last["t"] - mid["t"], 1e-9)
    return min(rate, fraction * sustained)


def _report(samples: list[dict[str, Any]], results: list[tuple[int, dict[str, Any]]],
            trained: int, began: float, seconds: float, warmup: float, rate: float,
            window: float) -> dict[str, Any]:
    accepted = sum(r[0] for r in results)
    lat = {k: [x for _, ls in results for x in ls[k]] for k in ("lease", "submit")}
    after = [s for s in samples if s["t"] >= warmup]
    tenth = (seconds - warmup) * window
    first = (began + warmup, began + warmup + tenth)
    last = (began + seconds - tenth, began + seconds)
    p99 = {k: {"first_ms": _percentile(v, *first, 99), "last_ms": _percentile(v, *last, 99)}
           for k, v in lat.items()}
    p50 = {k: {"first_ms": _percentile(v, *first, 50), "last_ms": _percentile(v, *last, 50)}
           for k, v in lat.items()}
    cpu = {"first_ms": _cpu_per_trajectory(samples, warmup, warmup + tenth),
           "last_ms": _cpu_per_trajectory(samples, seconds - tenth, seconds)}
    rates = {"first": _rate(samples, warmup, warmup + tenth),
             "last": _rate(samples, seconds - tenth, seconds)}
    rss0, rss1 = after[0]["rss_mb"], after[-1]["rss_mb"]
    # the database (and its WAL) is bounded by retention; the payload log by its
    # segments: the one being appended to and one sealed, reclaimed once trained
    db0 = max(s["database_bytes"] for s in samples if s["t"] < warmup + tenth)
    db1 = after[-1]["database_bytes"]
    payload_max = max(s["payload_bytes"] for s in after)
    checks = {
        "rss_growth_after_warmup": round(rss1 / rss0 - 1, 4),
        "rss_growth_ok": rss1 <= 1.05 * rss0,
        **{f"{k}_p99_last_over_first": round(v["last_ms"] / v["first_ms"], 3)
           if v["first_ms"] and v["last_ms"] else None for k, v in p99.items()},
        **{f"{k}_p50_last_over_first": round(v["last_ms"] / v["first_ms"], 3)
           if v["first_ms"] and v["last_ms"] else None for k, v in p50.items()},
        "cpu_per_trajectory_last_over_first": round(cpu["last_ms"] / cpu["first_ms"], 3)
        if cpu["first_ms"] and cpu["last_ms"] else None,
        "database_growth": round(db1 / max(db0, 1) - 1, 4),
        # what retention holds follows the rate: the database's bytes per task remembered
        "database_bytes_per_task_remembered": {
            "warmup": round(db0 / max(max(s["remembered"] for s in samples
                                          if s["t"] < warmup + tenth), 1)),
            "end": round(db1 / max(max(s["remembered"] for s in after), 1))},
        "payload_log_max_mb": round(payload_max / 2**20, 1),
        "store_bounded": db1 <= 1.2 * db0 and payload_max <= 2 * SEGMENT_BYTES,
    }
    checks["latency_ok"] = all(checks[f"{k}_p99_last_over_first"] is not None
                               and checks[f"{k}_p99_last_over_first"] <= 1.2 for k in p99)
    checks["cpu_ok"] = (checks["cpu_per_trajectory_last_over_first"] is not None
                        and checks["cpu_per_trajectory_last_over_first"] <= 1.2)
    return {"seconds": seconds, "warmup_seconds": warmup,
            "target_trajectories_per_s": rate,
            "achieved_trajectories_per_s": round(accepted / seconds, 1),
            "achieved_over_target": round(accepted / seconds / rate, 3),
            "trajectories_per_s_first_and_last_tenth": rates,
            "accepted": accepted, "trained": trained, "p99": p99, "p50": p50,
            "cpu_ms_per_trajectory": cpu, "checks": checks,
            "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=10 * DEFAULT_RUN_INGEST,
                        help="trajectories per second the nodes aim at (both policies)")
    parser.add_argument("--steady", type=float, default=0.85,
                        help="from half-way through the warm-up, hold this fraction of the "
                             "rate the data layer sustained if below --rate (0: --rate "
                             "throughout, the nodes as fast as the server lets them)")
    parser.add_argument("--retain-seconds", type=float, default=120.0)
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--clients", type=int, default=2, help="node processes")
    parser.add_argument("--slots", type=int, default=16, help="tasks in flight per process")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="bench/results/soak.json")
    args = parser.parse_args()
    seconds = args.minutes * 60
    result = soak(seconds, args.rate, args.retain_seconds, seconds * args.warmup_fraction,
                  args.sample, args.clients, args.slots, args.tokens,
                  steady=args.steady or None)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "cpu": platform.processor() or _cpu_name()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
