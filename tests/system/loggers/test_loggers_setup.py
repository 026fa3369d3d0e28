"""A logger's set-up mistake stops the run in one line, before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from astraflow.errors import ConfigError
from astraflow.loggers.base import need


def test_a_missing_library_or_a_bad_setting_is_one_line_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"^logger=x needs no_such_lib_xyz: pip install "
                                          r"'astraflow\[x\]'$"):
        need("no_such_lib_xyz", "logger=x", "x")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "astraflow", "logger=wandb",
                           "logger.wandb.mode=online", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "astraflow: error: logger.wandb.mode=online needs WANDB_API_KEY set (or run offline, "
        "the default, and `wandb sync` later)")
    assert not (tmp_path / "run").exists()
