"""Data-layer throughput: durable ingest and batch serving vs a bare echo endpoint.

Starts ``astraflow dataflow`` (a real uvicorn process over a real SQLite store), then
runs several client processes, each with several concurrent requests:

* ingest -- RaaS-node loop: lease tasks, submit groups of 1k-token trajectories
  (msgpack, acknowledged only once committed), each submission leasing the next task;
* echo   -- the same submission bodies posted to ``/v1/echo`` (auth + body read on the
  same stack, no decoding, no store): the ceiling ingest is measured against;
* serve  -- trainers (distinct trainer ids) pulling batches and acknowledging them.

On a machine shared with other work the rates drift with the neighbours' load, so the
CPU each phase cost (server process from /proc, clients from their own clocks) is
reported too, per trajectory: ``cpu_ratio`` is the ingest-to-echo ratio a machine of
our own would give while both are CPU-bound.

    python bench/dataflow.py --seconds 8 --out bench/results/dataflow.json
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np

from astraflow.dataflow.client import SOCKET_OPTIONS, AsyncDataflowClient, DataflowClient

TOKEN = "bench-token"


def _wire_group(group_size: int, tokens: int, prompt: int = 128) -> list[dict[str, Any]]:
    """One group of trajectories in wire form (task id filled in per submission)."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(group_size):
        mask = np.r_[np.zeros(prompt), np.ones(tokens - prompt)].astype(np.uint8)
        versions = np.where(mask == 1, 0, -1).astype("<i4")
        out.append({
            "task_id": "", "group_id": "g", "policy": "policy",
            "tokens": rng.integers(0, 32000, tokens).astype("<i4").tobytes(),
            "logprobs": (-rng.random(tokens)).astype("<f4").tobytes(),
            "loss_mask": mask.tobytes(),
            "versions": versions.tobytes(),
            "spans": [{"start": 0, "end": prompt, "source": "prompt", "version": -1},
                      {"start": prompt, "end": tokens, "source": "policy", "version": 0}],
            "reward": float(k % 2),
            "metadata": {"sample": k},
        })
    return out


async def _ingest_worker(url: str, seconds: float, concurrency: int, group_size: int,
                         tokens: int, echo: bool) -> tuple[int, float, float]:
    """Trajectories acknowledged (or echoed) by this process, the seconds it took and
    the CPU seconds it spent.

    The clocks start after registration, so process start-up is not measured.
    """
    group = _wire_group(group_size, tokens)
    done = 0
    async with AsyncDataflowClient(url, TOKEN) as client:
        node = await client.register("raas", pool="bench")
        cpu = time.process_time()
        start = time.monotonic()
        stop = start + seconds
        http = httpx.AsyncClient(base_url=url, transport=httpx.AsyncHTTPTransport(
            socket_options=SOCKET_OPTIONS), headers={"Authorization": f"Bearer {TOKEN}",
                                                     "Content-Type": "application/msgpack"})

        async def loop() -> None:
            nonlocal done
            leases: list = []
            while time.monotonic() < stop:
                if echo:
                    body = msgpack.packb({"lease_id": "x|1", "node_id": node,
                                          "trajectories": group})
                    (await http.post("/v1/echo", content=body)).raise_for_status()
                    done += group_size
                    continue
                if not leases:
                    leases.extend(await client.lease_tasks(max_tasks=8, wait=1.0))
                    continue
                lease = leases.pop()
                trajs = [{**t, "task_id": lease.task.task_id} for t in group]
                # as a RaaS node does: the submission leases the task that takes its slot
                out = await client.submit(lease, trajs, lease_more=1)
                leases.extend(out["leases"])
                done += out["accepted"]

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.monotonic() - start
        cpu = time.process_time() - cpu
        await http.aclose()
    return done, elapsed, cpu


def _ingest_process(args: tuple) -> tuple[int, float, float]:
    return asyncio.run(_ingest_worker(*args))


def _serve_process(args: tuple) -> tuple[int, float, float]:
    url, seconds, batch, trainer_id = args
    served = 0
    with DataflowClient(url, TOKEN) as client:
        cpu = time.process_time()
        start = time.monotonic()
        stop = start + seconds
        while time.monotonic() < stop:
            b = client.get_batch("policy", batch, timeout=2.0, trainer_id=trainer_id)
            if b is None:
                break
            client.ack_batch(b.batch_id, wait_seconds=0.0, step_seconds=0.0)
            served += len(b.items)
        elapsed = time.monotonic() - start
    return served, elapsed, time.process_time() - cpu


def _server_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) the server process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    """One phase: the total count over the slowest worker's window, and its CPU cost."""

    count: int
    seconds: float
    client_cpu: float
    server_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def cpu_us(self) -> float:
        """Server plus client CPU microseconds per trajectory."""
        return (self.client_cpu + self.server_cpu) / self.count * 1e6

    def report(self) -> dict[str, Any]:
        return {"trajectories": self.count, "seconds": round(self.seconds, 3),
                "trajectories_per_s": round(self.rate, 1),
                "cpu_us_per_trajectory": {
                    "server": round(self.server_cpu / self.count * 1e6, 1),
                    "clients": round(self.client_cpu / self.count * 1e6, 1)}}


def _phase(pool: Any, fn: Any, jobs: list[tuple], server: int,
           after: Any = None) -> Phase:
    """Run ``jobs``; the server's CPU is counted until ``after()`` (if given) returns."""
    cpu = _server_cpu(server)
    results = pool.map(fn, jobs)
    if after is not None:
        after()
    return Phase(sum(r[0] for r in results), max(r[1] for r in results),
                 sum(r[2] for r in results), _server_cpu(server) - cpu)


def _settle(client: DataflowClient, timeout: float = 60.0) -> None:
    """Wait until the store's checkpointer has copied ingest's WAL into the database.

    That copy is part of ingest's cost; left running, it would slow the phase after.
    """
    give_up = time.monotonic() + timeout
    while client.status()["store"]["wal_frames_pending"] and time.monotonic() < give_up:
        time.sleep(0.1)


def _warm() -> int:
    """Import the client in every worker before anything is timed."""
    return len(AsyncDataflowClient.__name__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=3, help="client processes")
    parser.add_argument("--concurrency", type=int, default=4, help="requests per process")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", default="bench/results/dataflow.json")
    args = parser.parse_args()

    store = Path(tempfile.mkdtemp(prefix="astraflow-bench-"))
    server = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "dataflow", "--port", "0", "--store", str(store),
         "--task", "arithmetic", "--group-size", str(args.group_size),
         "--batch-size", str(args.batch), "--policy", "policy=1000000",
         "--buffer-capacity", "10000000", "--lease-seconds", "600", "--bench-echo"],
        env={**os.environ, "ASTRAFLOW_TOKEN": TOKEN},
    )
    try:
        deadline = time.monotonic() + 60
        while not (store / "url").exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the data layer did not start")
            time.sleep(0.05)
        url = (store / "url").read_text().strip()
        ctx = mp.get_context("spawn")
        probe = DataflowClient(url, TOKEN)
        with ctx.Pool(args.clients) as pool:
            pool.starmap(_warm, [()] * args.clients)
            ingest_jobs = [(url, args.seconds, args.concurrency, args.group_size, args.tokens,
                            False)] * args.clients
            echo_jobs = [(url, args.seconds, args.concurrency, args.group_size, args.tokens,
                          True)] * args.clients
            # echo before and after ingest: neighbours' load drifts, the mean is fairer;
            # ingest is charged for its WAL checkpoint, which runs on after the clients stop
            echos = [_phase(pool, _ingest_process, echo_jobs, server.pid)]
            ingest = _phase(pool, _ingest_process, ingest_jobs, server.pid,
                            after=lambda: _settle(probe))
            echos.append(_phase(pool, _ingest_process, echo_jobs, server.pid))
            serve_jobs = [(url, args.seconds, args.batch, f"trainer-{i}")
                          for i in range(args.clients)]
            serve = _phase(pool, _serve_process, serve_jobs, server.pid)
        status = probe.status()
        probe.close()
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(store, ignore_errors=True)
    echo_rate = sum(e.rate for e in echos) / 2
    echo_cpu = sum(e.cpu_us for e in echos) / 2
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "setup": {**vars(args), "store": "sqlite WAL, synchronous=NORMAL"},
        "ingest": ingest.report(),
        "echo": {"trajectories_per_s": round(echo_rate, 1),
                 "before_and_after_ingest": [e.report() for e in echos]},
        "ingest_to_echo_ratio": round(ingest.rate / echo_rate, 3),
        "cpu_ratio": round(echo_cpu / ingest.cpu_us, 3),
        "serve": serve.report(),
        "server_counts": {"accepted": status["trajectories"]["accepted"],
                          "consumed": status["trajectories"]["consumed"]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
