"""Agent harnesses people already use, installed from the npm registry at pinned versions.

Claude Code and Codex CLI run unchanged against a node's endpoint (``workflow=agent
agent.command=...``). Tests and examples install them once per machine into the cache
(``$ASTRAFLOW_CACHE/npm/<package>@<version>``, about 400 MB each: both ship a native
binary) and call them from there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

#: command -> (npm package, pinned version)
HARNESSES = {"claude": ("@anthropic-ai/claude-code", "2.1.328"),
             "codex": ("@openai/codex", "0.169.0")}


class HarnessUnavailable(RuntimeError):
    """Node.js or npm is missing (tests skip on it; a failed install is an error)."""


def _cache() -> Path:
    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow")) / "npm"


def harness(command: str) -> str:
    """The ``command`` harness (``claude`` or ``codex``) to run: ``$CLAUDE_BIN`` /
    ``$CODEX_BIN``, else the one on PATH, else the pinned version, installed once."""
    return (os.environ.get(f"{command.upper()}_BIN") or shutil.which(command)
            or str(install_harness(command)))


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
            raise RuntimeError(f"npm install {package}@{version} failed "
                                     f"({done.returncode}): {done.stderr.strip()[-400:]}")
        (root / ".installed").write_text(version)
    return binary


def make_terse_chat_model(out_dir: str | os.PathLike[str], context: int = 131072,
                          steps: int = 150) -> str:
    """The chat fixture's shape and tokenizer with a ``context``-token context, taught in
    ``steps`` supervised steps to answer any chat turn with ``hi`` and its end-of-turn
    token: a harness driven by it gets a short, finished reply at every turn (a random
    model writes ~400 tokens before it ends one, and a harness fails a reply cut at its
    limit). Built once, cached like the other fixtures."""
    import random

    from transformers import AutoTokenizer

    from astraflow.testing import models

    base = models.make_chat_model(Path(out_dir).with_name(Path(out_dir).name + "-base"),
                                  arch="qwen2", seed=0, context=context)
    fingerprint = {"format": 1, "kind": "terse-chat", "base": json.loads(
        (Path(base) / models._STAMP).read_text())["weights_sha256"], "steps": steps}

    def write(tmp: Path) -> None:
        shutil.copytree(base, tmp, dirs_exist_ok=True)
        (tmp / models._STAMP).unlink()
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        rng = random.Random(0)
        words = [w for line in models.default_corpus() for w in line.split()]
        target = tokenizer.encode("hi" + models.IM_END, add_special_tokens=False)
        examples = []
        def text_of(most: int) -> str:
            return " ".join(rng.choices(words, k=rng.randint(1, most)))

        for _ in range(512):
            turns = [{"role": "system", "content": text_of(30)},
                     {"role": "user", "content": text_of(12)}]
            text = tokenizer.apply_chat_template(turns, add_generation_prompt=True,
                                                 tokenize=False)
            examples.append((tokenizer.encode(text, add_special_tokens=False), target))
        models.sft_warmstart(tmp, examples, steps=steps, lr=3e-3, batch=16)

    return models._build(Path(out_dir), fingerprint, write)


__all__ = ["HARNESSES", "HarnessUnavailable", "install_harness", "make_terse_chat_model"]
