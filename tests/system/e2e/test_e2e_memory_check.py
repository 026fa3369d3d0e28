"""A run that cannot fit in this machine's memory is refused before anything starts, in
one console line naming the estimate, the memory there is, the biggest component and
the setting to change; the default run passes the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sized_checkpoints import header_only_checkpoint

from astraflow.launch.memory import GIB, available, machine_memory


def launch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow", f"run_dir={tmp_path / 'run'}",
         "launcher.progress=false", *overrides],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_run_too_big_for_the_machine_is_refused_in_one_line(tmp_path, tiny_model_dir):
    """A 1.5B-parameter checkpoint (its header alone, the file sparse), trained with
    float32 AdamW beside a node and an evaluator, on a machine of 24 GiB."""
    limit, where = machine_memory()
    assert limit < 64 * GIB, "this test assumes a machine smaller than the run"
    model = header_only_checkpoint(tmp_path / "big", tokenizer_from=tiny_model_dir)
    proc = launch(tmp_path, f"model.path={model}", "trainer.micro_batch_size=16")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("astraflow: error: this run needs about "), line
    assert "GiB at its peak (trainer-policy " in line
    assert "1.54B parameters x 16 B for float32 AdamW" in line
    assert "rollout node " in line and "eval-policy " in line
    assert f"but {available(limit, where)};" in line
    assert "trainer.lora.rank=16" in line
    assert line.endswith("or set launcher.memory_check=false to start it anyway")
    assert not (tmp_path / "run").exists()  # nothing was made, nothing started
