"""One data layer against 10, 100 and 500 simulated RaaS nodes: lease latency and throughput.

Each simulated node is the real node runtime (``astraflow.raas.node.RaaSNode``: its own
HTTP client, registration, heartbeats, weight catch-up, lease -> workflow -> submit
loop) over ``raas=sim`` (a fixed generation latency, no model). The nodes of one size
are spread over a few worker processes, each running its share as asyncio tasks on
one event loop, so hundreds of nodes fit on a small machine; what the data layer sees
is hundreds of independent clients. A trainer stand-in in this process pulls and
acknowledges batches so buffers drain (it trains nothing), and no new weight version is
published, so staleness never drops work.

With ``--light`` a simulated node is its wire calls alone (``_lightnode.py``: register,
lease, submit leasing the next, heartbeats as the data layer advises) over a connection
of its own: a whole node runtime costs its process so much CPU that a thousand of them
saturate two cores before the data layer does, and this is how thousands are measured.

On a machine with few cores the worker processes compete with the data layer for CPU:
the numbers are a floor for the data layer, and the ratios against the first size of
the same run say how it degrades with the number of clients.

    python bench/scale.py --sizes 10 100 500 --seconds 15 --out bench/results/scale.json
    python bench/scale.py --light --sizes 500 1000 5000 10000 --workers 4 \
        --out bench/results/scale-light.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _machine import cache_root, cpu_model, machine

TOKEN = "bench-scale-token"
GROUP_SIZE = 4
BATCH = 64


def make_config(run_dir: Path, generation_seconds: float) -> Path:
    """A resolved run config (raas=sim over the tiny model's tokenizer)."""
    from astraflow.config import ModelConfig, compose_config
    from astraflow.launch.prepare import prepare
    from astraflow.models.tiny import make_tiny_model

    cache = cache_root()
    model = make_tiny_model(cache / "models" / "tiny-untrained-seed0",
                            ModelConfig(warmstart_steps=0), seed=0)
    cfg = compose_config(["+raas=sim", f"raas.generation_seconds={generation_seconds}",
                          f"model.path={model}", f"run_dir={run_dir}",
                          f"group_size={GROUP_SIZE}", f"batch_size={BATCH}",
                          # the stand-in trainer acknowledges a batch at once, hundreds a
                          # second when batches wait: at a bound of 1,000 versions the
                          # data layer would refuse leases whose samples would arrive
                          # that many steps late (the bench measures serving, not pacing)
                          "dataflow.buffer_capacity=100000",
                          "policies.policy.max_staleness=1000000"])
    prepare(cfg)
    return run_dir / "config.yaml"


def start_dataflow(run_dir: Path, config: Path, framework: bool = False
                   ) -> tuple[subprocess.Popen, str]:
    """The data layer; ``framework``: leases, submissions and heartbeats through the web
    framework's routes instead of its fast path (the baseline of ``--routes both``)."""
    store = run_dir / "store"
    store.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "dataflow", "--store", str(store), "--config",
         str(config), *(["--framework-routes"] if framework else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, ASTRAFLOW_TOKEN=TOKEN))
    deadline = time.time() + 60
    while not (store / "url").exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("the data layer did not start")
        time.sleep(0.1)
    return proc, (store / "url").read_text().strip()


def publish_weights(url: str) -> None:
    """Version 0 of a stand-in weight stream: nodes catch up to it before they lease."""
    from astraflow.weights.client import HttpPublishTarget
    from astraflow.weights.publisher import WeightPublisher
    from astraflow.weights.safetensors_io import Tensor

    publisher = WeightPublisher(HttpPublishTarget(url, TOKEN), "policy")
    publisher.publish(0, {"w": Tensor.from_array(np.zeros(16, dtype=np.float32))})


def consume(url: str, stop: threading.Event) -> None:
    """The trainer stand-in: pull batches and acknowledge them at once."""
    from astraflow.dataflow.client import DataflowClient

    with DataflowClient(url, TOKEN) as client:
        client.register("trainer", policies=["policy"], node_id="trainer-bench")
        beat = time.monotonic()
        while not stop.is_set():
            try:
                # as a trainer's runtime does: one that stops beating is retired, and
                # the data layer then refuses leases for its policy (trainer_gone)
                if time.monotonic() - beat > 2.0:
                    client.heartbeat()
                    beat = time.monotonic()
                batch = client.get_batch("policy", BATCH, timeout=1.0,
                                         trainer_id="trainer-bench")
                if batch is not None:
                    client.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=0.0)
            except httpx.HTTPError as exc:  # a slow answer must not end the consumer
                if not stop.is_set():
                    print(f"trainer stand-in: {exc!r}; going on", file=sys.stderr)


def resident_mb(pid: int) -> float:
    """A process's resident memory (from /proc), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _joined(url: str) -> int:
    """Nodes of the pool registered so far (-1 when the data layer, busy with the
    joining, did not answer in time)."""
    try:
        return int(status(url)["pools"].get("sim", {}).get("nodes", 0))
    except httpx.TimeoutException:
        return -1


def status(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"},
                     timeout=30).json()


async def run_nodes(url: str, config: str, work_dir: str, first: int, count: int,
                    concurrency: int, stop_file: Path) -> dict[str, Any]:
    """``count`` node runtimes on this event loop; every lease call timed."""
    from astraflow.components import load_config
    from astraflow.raas.node import NodeOptions, RaaSNode

    cfg = load_config(config)
    leases: list[tuple[float, float]] = []
    stop = asyncio.Event()
    nodes = []
    for i in range(first, first + count):
        node = RaaSNode(cfg, url, TOKEN, os.path.join(work_dir, f"n{i}"),
                        NodeOptions(pool="sim", concurrency=concurrency), f"sim-{i}")
        lease = node.client.lease_tasks

        async def timed(*args: Any, _lease: Any = lease, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = await _lease(*args, **kw)
            leases.append((time.time(), time.perf_counter() - t0))
            return out

        node.client.lease_tasks = timed
        nodes.append(node)
    tasks = [asyncio.create_task(n.run(stop)) for n in nodes]
    while not stop_file.exists():
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"leases": leases, "rollouts": sum(n.completed for n in nodes)}


def worker(args: argparse.Namespace) -> None:
    if args.light:
        from _lightnode import run_light_nodes

        result = asyncio.run(run_light_nodes(args.url, TOKEN, args.first, args.count,
                                             args.concurrency, args.generation_seconds,
                                             GROUP_SIZE, Path(args.stop_file)))
    else:
        result = asyncio.run(run_nodes(args.url, args.config, args.work_dir, args.first,
                                       args.count, args.concurrency, Path(args.stop_file)))
    Path(args.result).write_text(json.dumps(result))


def measure(size: int, workers: int, seconds: float, concurrency: int,
            generation_seconds: float, root: Path, light: bool = False,
            settle: float = 10.0, framework: bool = False) -> dict[str, Any]:
    run_dir = root / f"n{size}{'-framework' if framework else ''}"
    config = make_config(run_dir, generation_seconds)
    dataflow, url = start_dataflow(run_dir, config, framework)
    stop_consumer = threading.Event()
    consumer = None
    procs = []
    try:
        publish_weights(url)
        consumer = threading.Thread(target=consume, args=(url, stop_consumer), daemon=True)
        consumer.start()
        stop_file = run_dir / "stop"
        share = [size // workers + (i < size % workers) for i in range(workers)]
        first = 0
        for i, count in enumerate(share):
            procs.append((subprocess.Popen(
                [sys.executable, __file__, "--worker", "--url", url, "--config", str(config),
                 "--work-dir", str(run_dir / "nodes"), "--first", str(first), "--count",
                 str(count), "--concurrency", str(concurrency), "--stop-file", str(stop_file),
                 "--result", str(run_dir / f"worker{i}.json"),
                 "--generation-seconds", str(generation_seconds),
                 *(["--light"] if light else [])],
                env=dict(os.environ, OMP_NUM_THREADS="1")), run_dir / f"worker{i}.json"))
            first += count
        t_joined = time.time()
        deadline = t_joined + 300
        while (joined := _joined(url)) < size:
            if time.time() > deadline or any(p.poll() is not None for p, _ in procs):
                raise RuntimeError(f"only {joined} of {size} nodes registered")
            time.sleep(1.0)
        join_seconds = time.time() - t_joined
        # past the joining nodes' first leases (queued all at once) to the steady state
        time.sleep(settle)
        t0, before, cpu0 = time.time(), status(url), cpu_seconds(dataflow.pid)
        nodes_cpu0 = sum(cpu_seconds(p.pid) for p, _ in procs)
        time.sleep(seconds)
        t1, after, cpu1 = time.time(), status(url), cpu_seconds(dataflow.pid)
        nodes_cpu = sum(cpu_seconds(p.pid) for p, _ in procs) - nodes_cpu0
        rss_mb = resident_mb(dataflow.pid)
        stop_file.touch()
        results = []
        for proc, path in procs:
            proc.wait(timeout=300)
            results.append(json.loads(path.read_text()))
    finally:
        stop_consumer.set()
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
        dataflow.terminate()
        dataflow.wait(timeout=30)
        if consumer is not None:
            consumer.join(timeout=10)
    joining = np.array([lat for r in results for t, lat in r["leases"] if t < t0] or [np.nan])
    window = np.array([lat for r in results for t, lat in r["leases"] if t0 <= t <= t1]
                      or [np.nan])
    submits = np.array([lat for r in results for t, lat in r.get("submits", [])
                        if t0 <= t <= t1] or [np.nan])
    accepted = after["trajectories"]["accepted"] - before["trajectories"]["accepted"]
    tasks = after["tasks"]["completed"] - before["tasks"]["completed"]
    ceiling = size * concurrency / generation_seconds  # tasks/s if leasing cost nothing
    return {
        "nodes": size,
        "worker_processes": workers,
        "nodes_kind": "light" if light else "runtime",
        "routes": "framework" if framework else "fast path",
        "join_seconds": round(join_seconds, 2),
        # the leases of the joining nodes and the settling after (all asked at once)
        "joining_lease_p99_ms": round(float(np.percentile(joining, 99)) * 1e3, 2),
        "lease_calls": int(np.isfinite(window).sum()),
        "lease_p50_ms": round(float(np.percentile(window, 50)) * 1e3, 2),
        "lease_p99_ms": round(float(np.percentile(window, 99)) * 1e3, 2),
        # a light node's submission also leases its next task (as the node runtime's does)
        "submit_calls": int(np.isfinite(submits).sum()),
        "submit_p50_ms": round(float(np.percentile(submits, 50)) * 1e3, 2),
        "submit_p99_ms": round(float(np.percentile(submits, 99)) * 1e3, 2),
        "trajectories_per_second": round(accepted / (t1 - t0), 1),
        "tasks_per_second": round(tasks / (t1 - t0), 1),
        "tasks_per_second_ceiling": ceiling,
        "fraction_of_ceiling": round(tasks / (t1 - t0) / ceiling, 3),
        # near 1.0: the data layer's one event loop is the bottleneck; well below with
        # slow leases: the node processes (sharing the same cores) are
        "dataflow_cpu_fraction": round((cpu1 - cpu0) / (t1 - t0), 3),
        "dataflow_rss_mb": round(rss_mb, 1),
        "nodes_cpu_fraction": round(nodes_cpu / (t1 - t0), 3),
        "leases_shed": after["overload"]["leases_shed"] - before["overload"]["leases_shed"],
        # leases admission refused in the window, by kind (backpressure, staleness, ...)
        "admission_refusals": _refusals(before, after),
        "connects_per_node": round(sum(r.get("connects", 0) for r in results) / size, 2),
        "errors": [e for r in results for e in r.get("errors", [])][:5],
    }


def _refusals(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for policy, info in after["policies"].items():
        was = before["policies"].get(policy, {}).get("admission_refusals", {})
        for kind, n in info.get("admission_refusals", {}).items():
            if n - was.get(kind, 0):
                out[kind] = out.get(kind, 0) + n - was.get(kind, 0)
    return out


def _compare_routes(rows: list[dict[str, Any]]) -> None:
    """With both routes measured, each fast-path row's figures over the framework's at
    the same size (lease p99 below 1 and throughput above 1: the fast path gains)."""
    framework = {r["nodes"]: r for r in rows if r["routes"] == "framework"}
    for row in rows:
        base = framework.get(row["nodes"])
        if row["routes"] == "framework" or base is None:
            continue
        row["vs_framework"] = {
            k: round(row[k] / base[k], 2) if base[k] else None
            for k in ("lease_p99_ms", "submit_p99_ms", "trajectories_per_second",
                      "dataflow_cpu_fraction")}
        print(f"{row['nodes']:5d} nodes, fast path over framework: "
              + ", ".join(f"{k} {v}x" for k, v in row["vs_framework"].items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=2, help="node processes per size")
    parser.add_argument("--concurrency", type=int, default=2, help="tasks in flight per node")
    parser.add_argument("--generation-seconds", type=float, default=1.0)
    parser.add_argument("--light", action="store_true",
                        help="light nodes: the node's wire calls alone, one HTTP client a "
                             "process (thousands of nodes on a few cores)")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds after every node joined before measuring")
    parser.add_argument("--routes", choices=("fast", "framework", "both"), default="fast",
                        help="leases, submissions and heartbeats on the data layer's fast "
                             "path, through the web framework, or both (each size measured "
                             "through the framework first: the fast path's baseline)")
    parser.add_argument("--out", default="bench/results/scale.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--url", "--config", "--work-dir", "--stop-file", "--result"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    root = Path(tempfile.mkdtemp(prefix="astraflow-scale-"))
    variants = {"fast": [False], "framework": [True], "both": [True, False]}[args.routes]
    try:
        rows = [measure(size, args.workers, args.seconds, args.concurrency,
                        args.generation_seconds, root, args.light, args.settle, framework)
                for size in args.sizes for framework in variants]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _compare_routes(rows)
    base = rows[0]
    for row in rows:
        row["throughput_vs_baseline"] = round(
            row["trajectories_per_second"] / max(base["trajectories_per_second"], 1e-9), 2)
        row["lease_p99_vs_baseline"] = round(row["lease_p99_ms"] / base["lease_p99_ms"], 2)
        print(f"{row['nodes']:4d} nodes ({row['routes']}): lease p50 "
              f"{row['lease_p50_ms']:7.2f} ms  p99 "
              f"{row['lease_p99_ms']:7.2f} ms  submit p99 {row['submit_p99_ms']:7.2f} ms  "
              f"{row['trajectories_per_second']:8.1f} traj/s "
              f"({row['throughput_vs_baseline']}x the {base['nodes']}-node baseline, "
              f"{row['fraction_of_ceiling']:.0%} of the sim ceiling; data layer CPU "
              f"{row['dataflow_cpu_fraction']:.0%}, {row['dataflow_rss_mb']:.0f} MB; "
              f"{cpu_model()})", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": machine(),
        "settings": {"seconds": args.seconds, "concurrency_per_node": args.concurrency,
                     "generation_seconds": args.generation_seconds, "group_size": GROUP_SIZE,
                     "settle_seconds": args.settle,
                     "worker_processes": args.workers, "light_nodes": args.light,
                     "routes": args.routes},
        "sizes": rows,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
