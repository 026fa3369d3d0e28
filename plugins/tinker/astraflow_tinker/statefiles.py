"""A saved state on disk: safetensors files written as one directory, atomically.

What :class:`~astraflow_tinker.engine.Engine` saves (a tenant's adapter, its AdamW
moments, its spec) and reads back, checked tensor by tensor against what it loads into.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from astraflow_tinker.losses import EngineError


def config_hash(model_dir: Path) -> str:
    """The base checkpoint's config.json, less the fields a re-save changes."""
    config = json.loads((model_dir / "config.json").read_text())
    for key in ("transformers_version", "_name_or_path"):
        config.pop(key, None)
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise EngineError(f"{path}: unreadable ({exc})") from None


def strip_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def copy_into(dest: dict[str, Any], source: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``source`` into ``dest``, which must have the same keys and shapes."""
    if set(dest) != set(source):
        missing, extra = sorted(set(dest) - set(source)), sorted(set(source) - set(dest))
        raise EngineError(f"{where}: tensors do not match the adapter (missing "
                          f"{missing[:3]}, unexpected {extra[:3]})")
    for k, v in source.items():
        if tuple(v.shape) != tuple(dest[k].shape):
            raise EngineError(f"{where}: {k} has shape {tuple(v.shape)}, the adapter's is "
                              f"{tuple(dest[k].shape)}")
    with torch.no_grad():
        for k, v in source.items():
            dest[k].copy_(v)


def write_atomically(directory: Path, write: Callable[[Path], None]) -> None:
    """Write a directory under a temporary name, then rename it into place: a kill leaves
    either the old directory or the new one (renamed aside for a moment in between)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        write(tmp)
        for path in tmp.iterdir():
            with path.open("rb") as f:
                os.fsync(f.fileno())
        if directory.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.rename(directory, old / "state")
            os.rename(tmp, directory)
            shutil.rmtree(old)
        else:
            os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fd = os.open(directory.parent, os.O_RDONLY)  # the rename itself survives a power cut
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
