"""AstraFlow against TRL's GRPOTrainer at a real model's size: memory, step time, refresh.

Both sides train one job on a checkpoint of a real model's shape made locally
(:func:`astraflow.testing.models.make_sized_chat_model`: Qwen2.5-0.5B's by default, 494M
parameters, bf16 safetensors of 988 MB, randomly initialised; this measures the
machinery, not learning): 64 arithmetic prompts in a JSONL file, 2 prompts x 4 samples a
step (``batch_size=8 group_size=4``), 8 new tokens, fp32 AdamW, the same seed. The
reward is a Python file drawing a uniform number: a random model's completions would
all score 0, every advantage would be 0 and no weight would move, so versions and their
deltas would say nothing of a real run's.

* AstraFlow: ``python -m astraflow`` at its defaults but for the model, the task, the
  reward and the batch (``--raas vllm``: the vLLM engine, its KV cache of
  ``raas.kv_cache_gib`` reserved in RAM);
* TRL: ``bench/_trl_grpo.py`` on the very config AstraFlow resolved, in TRL's own
  virtualenv (made once by ``bench/peers.py``'s :func:`trl_python`), 2 torch threads.

Figures, each side: peak memory (the proportional set size, PSS, of every process of
the run summed, sampled every 0.25 s; a page two processes share counts half in each),
time to the end of the first step, seconds a step after it (the median of steps 2..N;
AstraFlow's checkpoint writes are left out of it and given apart: TRL writes none), and
for AstraFlow the refresh latency (publication to a node serving the version) and the
bytes each version published (whole snapshot and sparse bf16 delta). Ratios are
AstraFlow / TRL.

Usage: python bench/realsize.py [--shape qwen2.5-0.5b] [--steps 6] [--raas hf|vllm]
       [--skip-trl] [--astraflow OVERRIDE...]
Writes bench/results/realsize.json (a key per engine); the runs stay in runs/realsize/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _machine import cache_root, machine, write_results

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results" / "realsize.json"
RUNS = REPO / "runs" / "realsize"

REWARD = '''"""A uniform draw: advantages that move the weights of a model that cannot answer."""
import random


def score(task, completion):
    return random.random()
'''


def make_job(shape: str) -> list[str]:
    """Build (or reuse) the checkpoint, the JSONL task and the reward; the overrides
    that run the job, the same for both sides."""
    from astraflow.tasks.arithmetic import ArithmeticConfig, ArithmeticTasks
    from astraflow.testing.models import make_sized_chat_model

    root = cache_root() / "models" / f"realsize-{shape}"
    print(f"realsize: the {shape} checkpoint in {root} (made once, ~20 s)", flush=True)
    model = make_sized_chat_model(root, shape)
    data = RUNS / "data"
    data.mkdir(parents=True, exist_ok=True)
    tasks = list(ArithmeticTasks(ArithmeticConfig()).train_tasks())[:64]
    (data / "train.jsonl").write_text("".join(
        json.dumps({"prompt": t.prompt, "answer": t.answer}) + "\n" for t in tasks))
    (data / "reward.py").write_text(REWARD)
    return [f"model.path={model}", "task=jsonl", f"task.train_files=[{data / 'train.jsonl'}]",
            f"task.tokenizer={model}", "reward=python", f"reward.path={data / 'reward.py'}",
            "batch_size=8", "group_size=4", "workflow.max_new_tokens=8"]


class PeakPss:
    """Samples the summed PSS of a process and its descendants until it ends."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.peak = 0
        self.by_process: dict[str, int] = {}  # each command's own peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self, pid: int) -> list[int]:
        out = [pid]
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    for child in fh.read().split():
                        out += self._tree(int(child))
        except OSError:
            pass
        return out

    @staticmethod
    def _pss(pid: int) -> tuple[str, int]:
        try:
            with open(f"/proc/{pid}/cmdline") as fh:
                args = fh.read().replace("\0", " ").split()
            name = " ".join(args[1:4])[:60]
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        return name, int(line.split()[1]) * 1024
        except OSError:
            pass
        return "", 0

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for pid in self._tree(self.pid):
                name, pss = self._pss(pid)
                total += pss
                if name:
                    self.by_process[name] = max(self.by_process.get(name, 0), pss)
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def measured(cmd: list[str], log: Path, env: dict[str, str] | None = None,
             cwd: Path | None = None) -> dict[str, Any]:
    started = time.time()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        sampler = PeakPss(proc.pid)
        code = proc.wait()
        sampler.stop()
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{cmd[0]} ... failed ({code}):\n{tail}")
    return {"started": started, "wall_seconds": time.time() - started,
            "peak_pss_bytes": sampler.peak,
            "peak_pss_by_process": dict(sorted(sampler.by_process.items(),
                                               key=lambda kv: -kv[1])[:8])}


def version_bytes(store: Path) -> dict[str, list[int]]:
    """Bytes of each kept version's whole snapshot and of its delta, from the store."""
    full: list[int] = []
    delta: list[int] = []
    for manifest in sorted(store.glob("v*/manifest.json")):
        if manifest.parent.name == "v0":
            continue
        for path in manifest.parent.glob("*.safetensors"):
            (delta if path.name.startswith("delta-") else full).append(path.stat().st_size)
    return {"full": full, "delta": delta}


def run_astraflow(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    shutil.rmtree(run_dir, ignore_errors=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    print(f"astraflow: running (log {log})", flush=True)
    out = measured([sys.executable, "-m", "astraflow", f"run_dir={run_dir}",
                    "launcher.progress=false", *overrides], log)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = sorted((r for r in records if r["kind"] == "train"), key=lambda r: r["step"])
    later = train[1:]
    refresh = [json.loads(line) for path in (run_dir / "metrics").glob("refresh-*.jsonl")
               for line in path.open()]
    latency = [r["since_published"] for r in refresh
               if r["version"] > 0 and r.get("since_published") is not None]
    store = next((run_dir / "store" / "weights").iterdir(), None)
    out.update(
        run_dir=str(run_dir),
        first_step_seconds=train[0]["time"] - out["started"],
        seconds_per_step=statistics.median(
            r["step_seconds"] - r.get("checkpoint_seconds", 0.0) for r in later),
        seconds_per_step_with_checkpoints=(train[-1]["time"] - train[0]["time"]) / len(later),
        checkpoint_seconds=[round(r.get("checkpoint_seconds", 0.0), 2) for r in train],
        steps=len(train),
        refresh_seconds=latency,
        bytes_per_version=version_bytes(store) if store else {},
    )
    return out


def run_trl(python: Path, config: Path, run_dir: Path, threads: int = 2) -> dict[str, Any]:
    out_json = run_dir / "trl.json"
    print(f"trl: running (log {run_dir / 'trl.log'})", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    out = measured([str(python), str(BENCH / "_trl_grpo.py"), str(config), str(out_json),
                    "--threads", str(threads)], run_dir / "trl.log", env=env, cwd=run_dir)
    data = json.loads(out_json.read_text())
    ends = [s["time"] - s["eval_seconds"] for s in sorted(data["steps"],
                                                          key=lambda s: s["step"])]
    out.update(first_step_seconds=ends[0] - out["started"],
               seconds_per_step=statistics.median(b - a for a, b in itertools.pairwise(ends)),
               steps=len(ends), run_dir=str(run_dir))
    return out


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def report(name: str, ours: dict[str, Any], trl: dict[str, Any] | None) -> dict[str, Any]:
    def ratio(key: str) -> float | None:
        return ours[key] / trl[key] if trl and trl.get(key) else None

    ratios = {k: ratio(k) for k in ("peak_pss_bytes", "seconds_per_step", "first_step_seconds")}
    print(f"\n{name}  ({machine()['cpu']}, {machine()['cpus']} CPUs)")
    print(f"{'':28}{'AstraFlow':>14}{'TRL':>14}{'ratio':>8}")
    rows = [("peak memory (PSS, all)", "peak_pss_bytes", _gb),
            ("seconds a step", "seconds_per_step", lambda v: f"{v:.1f} s"),
            ("to the end of step 1", "first_step_seconds", lambda v: f"{v:.1f} s")]
    for label, key, fmt in rows:
        theirs = fmt(trl[key]) if trl else "-"
        r = ratios[key]
        print(f"{label:28}{fmt(ours[key]):>14}{theirs:>14}{'' if r is None else f'{r:.2f}x':>8}")
    print(f"checkpoint writes (s, by step): {ours['checkpoint_seconds']}; a step with them: "
          f"{ours['seconds_per_step_with_checkpoints']:.1f} s")
    lat = ours["refresh_seconds"]
    if lat:
        print(f"refresh latency (publication -> serving): median {statistics.median(lat):.2f}"
              f" s, max {max(lat):.2f} s over {len(lat)} versions")
    sizes = ours["bytes_per_version"]
    print(f"bytes a version: full {[_gb(b) for b in sizes.get('full', [])]}, "
          f"delta {[_gb(b) for b in sizes.get('delta', [])]}")
    for who, side in (("AstraFlow", ours), ("TRL", trl)):
        if side:
            parts = ", ".join(f"{k} {_gb(v)}" for k, v in side["peak_pss_by_process"].items())
            print(f"  {who} per process (own peaks): {parts}")
    return {"astraflow": ours, "trl": trl, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--raas", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--astraflow", nargs="*", default=[],
                        help="AstraFlow-only overrides (not given to TRL)")
    args = parser.parse_args()
    from peers import shared_config, trl_python

    name = f"{args.shape}-{args.raas}"
    job = [*make_job(args.shape), f"steps={args.steps}"]
    if args.raas == "vllm":
        job.append("raas=vllm")
    ours = run_astraflow([*job, *args.astraflow], RUNS / name)
    trl = None
    if not args.skip_trl:
        trl_dir = RUNS / f"{name}-trl"
        shutil.rmtree(trl_dir, ignore_errors=True)
        trl_dir.mkdir(parents=True)
        shared_config(job, trl_dir)  # resolves and writes trl_dir/config.yaml
        trl = run_trl(trl_python(), trl_dir / "config.yaml", trl_dir)
    result = report(name, ours, trl)
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    old[name] = {"machine": machine(), "job": job, **result}
    write_results(RESULTS, old)


if __name__ == "__main__":
    main()
