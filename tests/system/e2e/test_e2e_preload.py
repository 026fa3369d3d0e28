"""Where forking from the preloaded parent is not safe, the launcher says so in one line
and starts every component fresh, and the run is the same run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from launched_runs import records

THREADER = '''
import threading
import time

threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
'''


def test_a_preloaded_module_that_starts_a_thread_makes_components_start_fresh(
        tmp_path, tiny_model_dir):
    (tmp_path / "threader.py").write_text(THREADER)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", "+experiment=smoke", f"model.path={tiny_model_dir}",
         "+raas=sim", f"run_dir={run_dir}", "launcher.progress=false",
         "launcher.preload_modules=[threader]"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "preloaded parent" in line]
    assert len(said) == 1 and re.fullmatch(
        r"astraflow: starting components without the preloaded parent: forking is not "
        r"safe: the preloaded modules started 1 thread\(s\) \(.*\)", said[0]), said
    starts = [r for r in records(run_dir / "metrics" / "launcher.jsonl") if r["event"] == "start"]
    assert {r["component"] for r in starts} == {"dataflow", "trainer-policy", "eval-policy",
                                                "raas-0"}
    assert not any(r["forked"] for r in starts)
    assert (run_dir / "summary.json").exists()
