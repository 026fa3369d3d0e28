"""Adapter streams: the identity of the base model an adapter was trained on.

A LoRA policy publishes adapter-only versions; every manifest of such a stream names
its base by ``base_sha256``, a digest of the base model's weight files, so a node
whose own model differs refuses the adapter instead of serving nonsense.

Hashing a 7B model's 15 GB takes a while, so a digest is cached per machine under
``$XDG_CACHE_HOME/astraflow`` (default ``~/.cache/astraflow``), keyed by each file's
path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from astraflow.weights._fs import sha256_file

log = logging.getLogger("astraflow.weights")
#: the files that hold a checkpoint's weights (config and tokenizer do not count)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILE = "adapter_model.safetensors"
_lock = threading.Lock()


class BaseMismatchError(ValueError):
    """An adapter was trained on another base model than the one this node serves."""


def weight_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(model_dir)
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "astraflow" / "base-sha256.json"


def base_sha256(model_dir: str | os.PathLike[str]) -> str:
    """One digest of a model directory's weight files (names and contents)."""
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    keys = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    key = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    cache_path = _cache_file()
    with _lock:
        try:
            cache = json.loads(cache_path.read_text())
        except (OSError, ValueError):
            cache = {}
        if isinstance(cache.get(key), str):
            return cache[key]
        size = sum(p.stat().st_size for p in files)
        if size > 1 << 30:
            log.warning("hashing the base model at %s (%.1f GB) once, to identify adapters",
                        model_dir, size / 1e9)
        digest = hashlib.sha256()
        for p in files:
            digest.update(f"{p.name}\0{sha256_file(p)}\n".encode())
        value = digest.hexdigest()
        cache[key] = value
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_path)
        except OSError as exc:  # a read-only home: hash again next time
            log.debug("cannot cache the base digest: %r", exc)
        return value


def check_adapter(adapter: dict[str, Any], model_dir: str, policy: str, version: int) -> None:
    """Refuse an adapter whose manifest names another base than ``model_dir``."""
    have = base_sha256(model_dir)
    if adapter["base_sha256"] != have:
        raise BaseMismatchError(
            f"{policy} v{version} is a LoRA adapter of base model {adapter['base_sha256'][:12]} "
            f"({adapter.get('base_name', '?')}), but this node serves model.path={model_dir} "
            f"({have[:12]}): start the node with the model the trainer adapts")


def write_peft_dir(version_dir: Path, adapter: dict[str, Any]) -> None:
    """Make a synced adapter version a ``peft`` adapter directory (what vLLM, SGLang and
    ``peft`` load): ``adapter_config.json`` beside ``adapter_model.safetensors``."""
    from astraflow.weights.store import MODEL_FILE

    (version_dir / ADAPTER_CONFIG).write_text(json.dumps(adapter["config"], indent=1))
    target = version_dir / ADAPTER_FILE
    if not target.exists():
        os.link(version_dir / MODEL_FILE, target)


def copy_adapter(path: str | os.PathLike[str], root: str | os.PathLike[str], name: str) -> str:
    """A private copy of the ``peft`` adapter directory ``path`` as ``root/name``: an engine
    that may read an adapter again (after evicting or restarting) must not find it pruned
    by the node's weight directory."""
    import shutil

    own = Path(root) / name
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir(parents=True)
    for file in (ADAPTER_CONFIG, ADAPTER_FILE):
        shutil.copyfile(Path(path) / file, own / file)
    return str(own)
