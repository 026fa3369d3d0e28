"""Agent harnesses people already use, installed from the npm registry at pinned versions.

Claude Code and Codex CLI run unchanged against a node's endpoint (``workflow=agent
agent.command=...``). Tests and examples install them once per machine into the cache
(``$ASTRAFLOW_CACHE/npm/<package>@<version>``, about 400 MB each: both ship a native
binary) and call them from there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

#: command -> (npm package, pinned version)
HARNESSES = {"claude": ("@anthropic-ai/claude-code", "2.1.328"),
             "codex": ("@openai/codex", "0.169.0")}


class HarnessUnavailable(RuntimeError):
    """Node.js or npm is missing, or the registry could not be reached."""


def _cache() -> Path:
    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow")) / "npm"


def install_harness(command: str, timeout: float = 600.0) -> Path:
    """The executable of ``command`` (``claude`` or ``codex``), installed once at its
    pinned version; :class:`HarnessUnavailable` saying why when it cannot be."""
    if command not in HARNESSES:
        raise ValueError(f"no harness {command!r}: one of {', '.join(HARNESSES)}")
    package, version = HARNESSES[command]
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise HarnessUnavailable(f"{command} needs Node.js and npm on PATH (apt-get install "
                                 "nodejs npm)")
    root = _cache() / f"{package.replace('/', '+')}@{version}"
    binary = root / "node_modules" / ".bin" / command
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time, per machine
        if binary.exists() and (root / ".installed").exists():
            return binary
        with contextlib.suppress(FileNotFoundError):
            (root / ".installed").unlink()
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix",
             str(root), f"{package}@{version}"],
            capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or not binary.exists():
            raise HarnessUnavailable(f"npm install {package}@{version} failed "
                                     f"({done.returncode}): {done.stderr.strip()[-400:]}")
        (root / ".installed").write_text(version)
    return binary


__all__ = ["HARNESSES", "HarnessUnavailable", "install_harness"]
