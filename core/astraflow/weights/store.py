"""A per-policy, monotonically versioned weight store on a directory.

Layout: ``<root>/<policy>/v<version>/`` holds ``manifest.json`` and a full snapshot
``model.safetensors`` and/or a delta ``delta-from-<base>.safetensors``. A version is
staged in a hidden sibling directory and renamed into place once every file is
written and fsynced, so readers (the HTTP service, nodes on a shared disk) see a
version completely or not at all.

Every manifest records ``model_sha256``: the digest of the canonical full snapshot of
that version, even when only a delta is stored, so a node that rebuilt a version from
deltas can prove it holds exactly what the trainer published.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.weights import codec
from astraflow.weights import safetensors_io as st
from astraflow.weights._fs import atomic_file, fsync_dir, sha256_file
from astraflow.weights.errors import CorruptError, VersionError

MODEL_FILE = "model.safetensors"
#: the store's key file (see :meth:`WeightStore.local_key`); no policy is named so
LOCAL_KEY = ".local-key"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "astraflow-weights/1"
_POLICY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_VERSION_DIR = re.compile(r"^v(\d+)$")
_DELTA_FILE = re.compile(r"^delta-from-(\d+)\.safetensors$")


def delta_name(base: int) -> str:
    return f"delta-from-{base}.safetensors"


def check_policy(policy: str) -> str:
    if not _POLICY.match(policy):
        raise ValueError(f"invalid policy name {policy!r}: use letters, digits, '_', '.', '-'")
    return policy


def check_file_name(name: str) -> str:
    if name != MODEL_FILE and not _DELTA_FILE.match(name):
        raise ValueError(f"invalid weight file name {name!r}: expected {MODEL_FILE} or "
                         "delta-from-<version>.safetensors")
    return name


@dataclass(frozen=True)
class FileRef:
    """One file a node fetches to move along a plan."""

    version: int
    name: str
    sha256: str
    bytes: int
    base: int | None  # None for a full snapshot

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "sha256": self.sha256,
                "bytes": self.bytes, "base": self.base}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileRef:
        return cls(int(data["version"]), str(data["name"]), str(data["sha256"]),
                   int(data["bytes"]), None if data["base"] is None else int(data["base"]))


def build_version(directory: Path, policy: str, version: int, tensors: Mapping[str, st.Tensor],
                  *, full: bool, delta_base: int | None = None,
                  blobs: Mapping[str, bytes] | None = None,
                  adapter: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write a version's files and manifest into ``directory``; returns the manifest.

    ``blobs`` are the per-tensor deltas from version ``delta_base`` (``codec.make_delta``).
    ``adapter`` marks the tensors as a LoRA adapter: its base model's digest
    (``base_sha256``) and its ``peft`` config (``config``).
    """
    if not full and delta_base is None:
        raise ValueError("a version needs a full snapshot, a delta, or both")
    if delta_base is not None and (blobs is None or delta_base >= version):
        raise ValueError("a delta needs the per-tensor blobs against an earlier version")
    files: dict[str, dict[str, Any]] = {}
    if full:
        info = st.save(directory / MODEL_FILE, tensors)
        model = info
        files[MODEL_FILE] = {"sha256": info.sha256, "bytes": info.bytes, "base": None}
    else:
        model = st.digest(tensors)
    if delta_base is not None:
        assert blobs is not None
        info = codec.save_delta_file(directory / delta_name(delta_base), delta_base, version,
                                     tensors, blobs)
        files[delta_name(delta_base)] = {"sha256": info.sha256, "bytes": info.bytes,
                                         "base": delta_base}
    manifest = {
        "format": MANIFEST_FORMAT, "policy": policy, "version": version,
        "created": time.time(), "model_sha256": model.sha256, "model_bytes": model.bytes,
        "tensors": {name: {"dtype": t.dtype, "shape": list(t.shape)}
                    for name, t in sorted(tensors.items())},
        "files": files,
    }
    if adapter is not None:
        manifest["adapter"] = dict(adapter)
    with atomic_file(directory / MANIFEST) as f:
        f.write(json.dumps(manifest, indent=1).encode())
    return manifest


def parse_manifest(data: bytes | str, policy: str, version: int) -> dict[str, Any]:
    """Validate a manifest (from disk or an upload) enough to serve and plan from it."""
    try:
        manifest = json.loads(data)
        ok = (manifest["format"] == MANIFEST_FORMAT and manifest["policy"] == policy
              and int(manifest["version"]) == version and isinstance(manifest["files"], dict)
              and len(manifest["model_sha256"]) == 64 and isinstance(manifest["tensors"], dict))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptError(f"manifest of {policy} v{version} is malformed: {exc}") from exc
    if not ok or not manifest["files"]:
        raise CorruptError(f"manifest of {policy} v{version} does not describe that version "
                           f"(format {MANIFEST_FORMAT}, at least one file)")
    for name, entry in manifest["files"].items():
        check_file_name(name)
        base = _DELTA_FILE.match(name)
        if (entry.get("base") is None) != (base is None) or (
                base and (int(base.group(1)) != entry["base"] or entry["base"] >= version)):
            raise CorruptError(f"manifest of {policy} v{version}: file {name} has base "
                               f"{entry.get('base')!r}")
        if not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int):
            raise CorruptError(f"manifest of {policy} v{version}: file {name} lacks sha256/bytes")
    adapter = manifest.get("adapter")
    if adapter is not None and not (
            isinstance(adapter, dict) and isinstance(adapter.get("config"), dict)
            and isinstance(adapter.get("base_sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", adapter["base_sha256"])):
        raise CorruptError(f"manifest of {policy} v{version}: adapter needs base_sha256 (64 hex "
                           "digits) and its peft config")
    return manifest


class WeightStore:
    """Directory-backed store; safe for one publisher per policy and many readers.

    ``keep_fulls`` sets retention: after each publish, versions older than the
    ``keep_fulls``-th newest full snapshot are deleted, unless the newest version would
    then no longer be reachable from a retained full snapshot.
    """

    def __init__(self, root: Path | str, keep_fulls: int | None = 2) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep_fulls = keep_fulls
        self._lock = threading.Lock()

    def local_key(self) -> str:
        """A random key in a file of the store's own (:data:`LOCAL_KEY`): a reader that
        finds it at the store's path sees this very store, and may take its files from
        disk instead of over HTTP."""
        path = self.root / LOCAL_KEY
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            with atomic_file(path) as f:
                f.write(secrets.token_hex(16).encode())
            return path.read_text().strip()

    # -- reading ---------------------------------------------------------------
    def policies(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and _POLICY.match(p.name) and self.versions(p.name))

    def versions(self, policy: str) -> list[int]:
        directory = self.root / check_policy(policy)
        if not directory.is_dir():
            return []
        found = (_VERSION_DIR.match(p.name) for p in directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self, policy: str) -> int | None:
        versions = self.versions(policy)
        return versions[-1] if versions else None

    def version_dir(self, policy: str, version: int) -> Path:
        return self.root / check_policy(policy) / f"v{int(version)}"

    def manifest(self, policy: str, version: int) -> dict[str, Any]:
        path = self.version_dir(policy, version) / MANIFEST
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise VersionError(f"{policy} has no version {version}; available: "
                               f"{self.versions(policy)}") from None
        return parse_manifest(data, policy, version)

    def file_path(self, policy: str, version: int, name: str) -> tuple[Path, dict[str, Any]]:
        """Path and manifest entry of one file of a visible version."""
        entry = self.manifest(policy, version)["files"].get(check_file_name(name))
        if entry is None:
            raise VersionError(f"{policy} v{version} has no file {name}")
        return self.version_dir(policy, version) / name, entry

    def plan(self, policy: str, have: int | None, want: int | None = None) -> list[FileRef]:
        """The fewest bytes that take a node from ``have`` (None: nothing) to ``want``.

        Deltas chain forward through any retained versions; a full snapshot replaces the
        chain whenever the chain is broken or costs more bytes.
        """
        versions = self.versions(policy)
        want = versions[-1] if want is None else want
        if want not in versions:
            raise VersionError(f"{policy} has no version {want}; available: {versions}")
        if have == want:
            return []
        best: dict[int, tuple[int, list[FileRef]]] = {}
        if have is not None:
            best[have] = (0, [])
        for version in versions:
            if version > want:
                break
            for name, entry in self.manifest(policy, version)["files"].items():
                ref = FileRef(version, name, entry["sha256"], entry["bytes"], entry["base"])
                start = (0, []) if ref.base is None else best.get(ref.base)
                if start is None:
                    continue
                cost = start[0] + ref.bytes
                if version not in best or cost < best[version][0]:
                    best[version] = (cost, [*start[1], ref])
        if want not in best:
            raise VersionError(f"{policy} v{want} is not reachable: no full snapshot or delta "
                               "chain is retained")
        return best[want][1]

    def load(self, policy: str, version: int | None = None) -> dict[str, st.Tensor]:
        """Materialise a version's tensors, following the cheapest plan from nothing."""
        version = self.latest(policy) if version is None else version
        if version is None:
            raise VersionError(f"{policy} has no published version")
        tensors: dict[str, st.Tensor] = {}
        for ref in self.plan(policy, None, version):
            path = self.version_dir(policy, ref.version) / ref.name
            if ref.base is None:
                tensors = st.load(path)[0]
            else:
                codec.apply_delta_file(tensors, codec.load_delta_file(path))
        return tensors

    # -- writing ---------------------------------------------------------------
    @contextlib.contextmanager
    def _policy_lock(self, policy: str) -> Iterator[Path]:
        directory = self.root / check_policy(policy)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock, open(directory / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield directory

    def staging(self, policy: str) -> Path:
        """A fresh hidden directory next to the versions, so committing is one rename."""
        directory = self.root / check_policy(policy)
        directory.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=directory))

    def publish(self, policy: str, version: int, tensors: Mapping[str, st.Tensor], *,
                full: bool = True, delta_base: int | None = None,
                base: Mapping[str, st.Tensor] | None = None) -> dict[str, Any]:
        """Publish ``version``; without ``base`` the delta base is loaded from the store."""
        blobs = None
        if delta_base is not None:
            blobs = codec.make_delta(self.load(policy, delta_base) if base is None else base,
                                     tensors)
        staging = self.staging(policy)
        try:
            build_version(staging, policy, version, tensors, full=full, delta_base=delta_base,
                          blobs=blobs)
            return self.commit(policy, version, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def commit(self, policy: str, version: int, staging: Path, *,
               verified: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Verify a staged version (manifest, sha256 of every file) and make it visible.

        ``verified`` maps a file's name to the sha256 the caller computed over exactly
        the bytes staged (the data layer, as the file's chunks arrived); those files are
        not read again.
        """
        manifest = parse_manifest((staging / MANIFEST).read_bytes(), policy, version)
        verified = verified or {}
        for name, entry in manifest["files"].items():
            path = staging / name
            if not path.is_file():
                raise CorruptError(f"{policy} v{version}: {name} listed but not uploaded")
            if path.stat().st_size != entry["bytes"] or (
                    verified.get(name) or sha256_file(path)) != entry["sha256"]:
                raise CorruptError(f"{policy} v{version}: {name} does not match its sha256")
        with self._policy_lock(policy) as directory:
            latest = self.latest(policy)
            if latest is not None and version <= latest:
                raise VersionError(f"{policy} v{version} is not newer than the latest "
                                   f"version {latest}; versions only grow")
            missing = [e["base"] for e in manifest["files"].values()
                       if e["base"] is not None and e["base"] not in self.versions(policy)]
            if len(missing) == len(manifest["files"]):
                raise VersionError(f"{policy} v{version} has only deltas from versions the "
                                   f"store does not hold ({missing}); publish a full snapshot")
            for stray in staging.iterdir():
                if stray.name != MANIFEST and stray.name not in manifest["files"]:
                    stray.unlink()
            final = self.version_dir(policy, version)
            staging.rename(final)
            fsync_dir(directory)
            if self.keep_fulls is not None:
                self._collect(policy)
        return manifest

    def _collect(self, policy: str) -> None:
        """Retention: keep the newest ``keep_fulls`` fulls and everything after the oldest."""
        versions = self.versions(policy)
        fulls = [v for v in versions if MODEL_FILE in self.manifest(policy, v)["files"]]
        if not fulls or self.keep_fulls is None:
            return
        newest = versions[-1]
        for cutoff in reversed(fulls[: max(len(fulls) - self.keep_fulls + 1, 1)]):
            kept = [v for v in versions if v >= cutoff]
            if self._reachable(policy, kept, newest):
                break
        else:
            return
        for version in versions:
            if version < cutoff:
                shutil.rmtree(self.version_dir(policy, version), ignore_errors=True)

    def _reachable(self, policy: str, kept: list[int], target: int) -> bool:
        reached: set[int] = set()
        for version in kept:
            for entry in self.manifest(policy, version)["files"].values():
                if entry["base"] is None or entry["base"] in reached:
                    reached.add(version)
        return target in reached
