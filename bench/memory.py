"""Pre-flight's memory estimate of a run beside what its components took at their peak.

Runs ``python -m astraflow`` with the given overrides (default: the smoke job), then
prints, component by component, the estimate the launcher checked
(:func:`astraflow.launch.memory.estimate`, from the run's resolved ``config.yaml`` and
its longest sampled prompt) and the peak the launcher measured (the ``peak_memory``
event: each component's resident memory summed over its process tree, or its own peak
as the kernel kept it when it was reaped). A forked component's resident memory counts
the pages it shares with the preloaded parent, as the estimate's per-process baseline
does. ``--estimate-only`` prints the estimate without running anything. Writes
``bench/results/memory.json``.

    python bench/memory.py                               # the smoke job
    python bench/memory.py -- model.path=DIR steps=5     # your run's settings
    python bench/memory.py --estimate-only -- model.path=DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _machine import machine, write_results
from omegaconf import DictConfig, OmegaConf

from astraflow.launch import memory

RESULTS = Path(__file__).parent / "results" / "memory.json"


def resolved(overrides: list[str]) -> DictConfig:
    """The config the launcher checks, as pre-flight builds it (no run directory)."""
    from astraflow.components import resolve_policies
    from astraflow.config import compose_config
    from astraflow.launch import preflight

    cfg = compose_config(overrides)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert isinstance(cfg, DictConfig)
    cfg.policies = resolve_policies(cfg)
    preflight.resolve_paths(cfg)
    return cfg


def prompt_tokens(cfg: DictConfig) -> int | None:
    from astraflow.launch import preflight

    if not cfg.model.path:
        return None
    if "tokenizer" in cfg.task and not cfg.task.tokenizer:
        cfg.task.tokenizer = cfg.model.path
    return preflight.check_prompts(cfg, preflight.task_source(cfg))


def evaluated(cfg: DictConfig) -> bool:
    """Whether the launcher starts evaluators: not for a task without a held-out split."""
    from astraflow.launch import preflight

    return bool(preflight.task_source(cfg).eval_tasks())


def measured(run_dir: Path) -> dict[str, int]:
    events = [json.loads(line) for line in (run_dir / "metrics" / "launcher.jsonl").open()]
    return next((e["peaks"] for e in reversed(events) if e["event"] == "peak_memory"), {})


def rows(est: memory.Estimate, peaks: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for part in est.parts:
        if part.name.startswith("rollout node"):
            names = [n for n in peaks if n.startswith("raas-")]
        elif part.name.startswith("launcher"):
            names = ["dataflow"]  # the launcher and its preloaded parent are not measured
        else:
            names = [part.name]
        took = [peaks[n] for n in names if n in peaks]
        out.append({"component": part.name, "count": part.count,
                    "estimate_gib_each": round(part.each / memory.GIB, 3),
                    "measured_gib_each": (round(max(took) / memory.GIB, 3) if took else None),
                    "terms_gib": {t.what: round(t.bytes / memory.GIB, 3) for t in part.terms}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimate-only", action="store_true")
    parser.add_argument("overrides", nargs="*", default=["+experiment=smoke"])
    args = parser.parse_args()
    overrides = [o for o in args.overrides if o != "--"] or ["+experiment=smoke"]
    limit, where = memory.machine_memory()
    peaks: dict[str, int] = {}
    if args.estimate_only:
        cfg = resolved(overrides)
        est = memory.estimate(cfg, prompt_tokens=prompt_tokens(cfg), machine=limit,
                              evaluated=evaluated(cfg))
    else:
        with tempfile.TemporaryDirectory(prefix="astraflow-bench-memory-") as root:
            run_dir = Path(root) / "run"
            proc = subprocess.run([sys.executable, "-m", "astraflow", f"run_dir={run_dir}",
                                   "launcher.progress=false", *overrides],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"the run failed:\n{proc.stderr[-3000:]}")
            cfg = OmegaConf.load(run_dir / "config.yaml")
            assert isinstance(cfg, DictConfig)
            est = memory.estimate(cfg, prompt_tokens=prompt_tokens(cfg), machine=limit,
                                  evaluated=evaluated(cfg))
            peaks = measured(run_dir)
    table = rows(est, peaks)
    print(f"estimate {memory.gib(est.bytes)} at its peak ({memory.available(limit, where)}); "
          f"sequences of {est.sequence_tokens} tokens")
    print(f"{'component':26s} {'count':>5s} {'estimate':>10s} {'measured':>10s}")
    for row in table:
        took = row["measured_gib_each"]
        print(f"{row['component']:26s} {row['count']:5d} {row['estimate_gib_each']:8.2f} GiB "
              + (f"{took:8.2f} GiB" if took is not None else f"{'-':>12s}"))
    print(est.said())
    write_results(RESULTS, {"machine": machine(), "overrides": overrides,
                            "memory_bytes": limit, "memory_is": where,
                            "estimate_bytes": est.bytes, "components": table,
                            "measured_peaks_bytes": peaks})


if __name__ == "__main__":
    main()
