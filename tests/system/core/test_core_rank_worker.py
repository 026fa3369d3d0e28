"""The rank-parity harness (``astraflow.testing.rank_worker``) forks a trainer's ranks
from one process that imported the backend; a backend whose import leaves a thread
running cannot be forked safely, and its ranks start under ``torchrun`` instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from astraflow.testing.rank_worker import write_batch
from astraflow.testing.trainer import arithmetic_batch

#: the harness, as ``run_ranks`` starts it, in a process where a thread already runs
#: (as if the backend's import had started it)
WITH_A_THREAD = """
import runpy, sys, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
sys.argv = ["rank_worker", *sys.argv[1:]]
runpy.run_module("astraflow.testing.rank_worker", run_name="__main__")
"""


def test_ranks_start_under_torchrun_where_a_thread_runs(tmp_path, tiny_model_dir):
    batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0], "b")
    write_batch(batch, tmp_path / "batch1.json")
    write_batch(batch, tmp_path / "batch2.json")
    done = subprocess.run(
        [sys.executable, "-c", WITH_A_THREAD, "--ranks", "2", "hf", tiny_model_dir,
         str(tmp_path), json.dumps({"world_size": 2})],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting the ranks under torchrun" in done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result) >= {"step1", "logprobs1", "step2"}
