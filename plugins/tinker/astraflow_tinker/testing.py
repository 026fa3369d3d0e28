"""``astraflow tinker`` started as a user starts it, for tests and examples."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from astraflow.testing import wait_until


@contextlib.contextmanager
def tinker_server(model_dir: str, state: Path, keys: list[str], name: str | None = None,
                  port: int = 0, poll_seconds: float = 2.0
                  ) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run ``astraflow tinker`` over ``model_dir`` with its ledger in ``state`` and the
    API ``keys``; yields (its URL, the process). SIGTERM at the end if still running."""
    state.mkdir(parents=True, exist_ok=True)
    key_file = state.parent / f"{state.name}-keys.txt"
    key_file.write_text("".join(f"{k}\n" for k in keys))
    (state / "url").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_TELEMETRY": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow", "tinker", "--model", model_dir,
         "--name", name or model_dir, "--state", str(state), "--keys", str(key_file),
         "--port", str(port), "--poll-seconds", str(poll_seconds)],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (state / "url").is_file() or proc.poll() is not None,
                   timeout=120, what="the tinker server to listen")
        if proc.poll() is not None:
            raise RuntimeError(f"astraflow tinker exited: {proc.stderr.read()}"
                               if proc.stderr else "astraflow tinker exited")
        yield (state / "url").read_text().strip(), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
