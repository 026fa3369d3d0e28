"""``raas=vllm`` on CPU: the model in the engine-core process (``raas.executor=auto``)
against a worker process of its own (``mp``, vLLM's CPU default), whole runs.

Each pair is two runs of ``python -m astraflow raas=vllm`` that differ only in
``raas.executor``, one after the other (order alternating by round, so both see the
same machine): the default job's tiny model, and the plain job on a Llama checkpoint with
its own BPE tokenizer, JSONL files and a reward file (``bench/_checkpoint.py``, built
and cached locally). Reported per run: seconds a step from the end of step 1 to the last
(start-up left out), the trainer's wait, the run's wall time and the CPU seconds of the
whole process tree; the ratio is mp's step time over auto's.

    python bench/vllm_executor.py --steps 100 --out bench/results/vllm_executor.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _checkpoint import make_checkpoint_job
from _machine import at_least_one, cache_root, launch, machine

EXECUTORS = ("auto", "mp")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one(name: str, overrides: list[str], root: Path) -> dict[str, float]:
    before = children_cpu()
    summary, _records, step_seconds = launch(name, overrides, root)
    policy = summary["policies"]["policy"]
    return {"step_seconds": step_seconds,
            "trainer_wait_fraction": policy["trainer_wait_fraction"],
            "wall_seconds": summary["wall_seconds"],
            "cpu_seconds": children_cpu() - before}


def main(args: argparse.Namespace) -> dict[str, Any]:
    jobs = {"tiny": [], "checkpoint": make_checkpoint_job(cache_root(), seed=0)}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        job: {ex: [] for ex in EXECUTORS} for job in jobs}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for job, overrides in jobs.items():
                for ex in EXECUTORS if rep % 2 == 0 else EXECUTORS[::-1]:
                    figures = one(f"{job}-{ex}-{rep}",
                                  [*overrides, "raas=vllm", f"raas.executor={ex}",
                                   f"steps={args.steps}", "eval_every=0"], Path(tmp))
                    runs[job][ex].append(figures)
                    print(f"round {rep} {job:10s} executor={ex:4s} "
                          f"{figures['step_seconds']:.3f} s/step, trainer waits "
                          f"{figures['trainer_wait_fraction']:.0%}, "
                          f"{figures['wall_seconds']:.0f} s, "
                          f"{figures['cpu_seconds']:.0f} CPU-s", flush=True)
    median = {job: {ex: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                    for ex, rs in by_ex.items()} for job, by_ex in runs.items()}
    return {"benchmark": "vllm_executor", "machine": machine(), "settings": vars(args),
            "runs": runs, "median": median,
            "step_ratio_mp_over_auto": {
                job: m["mp"]["step_seconds"] / m["auto"]["step_seconds"]
                for job, m in median.items()},
            "cpu_ratio_mp_over_auto": {
                job: m["mp"]["cpu_seconds"] / m["auto"]["cpu_seconds"]
                for job, m in median.items()}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=at_least_one, default=100)
    parser.add_argument("--repeats", type=at_least_one, default=2)
    parser.add_argument("--out", default="bench/results/vllm_executor.json")
    cli = parser.parse_args()
    result = main(cli)
    cpu = result["machine"]["cpu"]
    for job, ratio in result["step_ratio_mp_over_auto"].items():
        m = result["median"][job]
        print(f"{cpu}: {job}: executor=auto {m['auto']['step_seconds']:.3f} s/step vs mp "
              f"{m['mp']['step_seconds']:.3f} = {ratio:.2f}x faster; CPU-seconds "
              f"{m['auto']['cpu_seconds']:.0f} vs {m['mp']['cpu_seconds']:.0f} "
              f"({result['cpu_ratio_mp_over_auto'][job]:.2f}x)")
    Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cli.out).write_text(json.dumps(result, indent=2) + "\n")
