"""The node side (and the trainer's HTTP upload): pull versions, verify, never trust.

A node keeps one verified full copy per policy under ``local_dir/<policy>/v<version>/``.
``sync`` follows the server's cheapest plan -- a delta chain from the local copy or a
full snapshot -- resumes interrupted downloads with HTTP Range, retries with
exponential backoff, and checks the rebuilt ``model.safetensors`` against the
published sha256 before the directory is handed out. A delta chain that fails any
check is abandoned for a full snapshot. The files of a plan download concurrently: across
a high-latency link a chain of k deltas costs one round trip, not k.

A version whose full snapshot fails its checksum too (a file altered or cut short on
the server after it was published) is refused, with one line in the log: ``newer``
then answers nothing new until a later version is published.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import httpx

from astraflow.weights import codec
from astraflow.weights import safetensors_io as st
from astraflow.weights._fs import atomic_file, fsync_dir
from astraflow.weights.errors import CorruptError, VersionError, WeightsError
from astraflow.weights.store import LOCAL_KEY, MANIFEST, MODEL_FILE, FileRef, check_policy
from astraflow.weights.upload import CHUNK_BYTES

log = logging.getLogger("astraflow.weights")
_CHUNK = 1 << 20
#: downloads of one file that fail its sha256 before it is taken for damaged on the server
_VERIFY_ATTEMPTS = 2
#: files of one plan fetched at once (each on its own pooled connection)
_PARALLEL = 4
#: refusals of a chunk in a row (damaged, out of place, too big) before an upload gives up
_CHUNK_REFUSALS = 8
#: the smallest chunk a publisher falls back to when a proxy refuses bigger ones (413)
_MIN_CHUNK = 64 << 10


class Synced(NamedTuple):
    version: int
    path: Path


class _Gone(WeightsError):
    """A planned file disappeared (retention ran meanwhile): plan again."""


class _Http:
    """httpx with bearer auth, retries and exponential backoff on transient failures."""

    def __init__(self, base_url: str, token: str, *, retries: int = 5, backoff: float = 0.1,
                 max_backoff: float = 5.0, timeout: float = 30.0,
                 retry_for: float = 0.0) -> None:
        self.client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                   headers={"Authorization": f"Bearer {token}"})
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        #: keep retrying for this many seconds even past ``retries`` attempts
        self.retry_for = retry_for

    def retrying(self) -> Iterator[int]:
        """Attempt numbers, sleeping between them; the caller breaks out on success.
        At least ``retries`` retries, and more until ``retry_for`` seconds have gone."""
        give_up = time.monotonic() + self.retry_for
        attempt = 0
        while attempt <= self.retries or time.monotonic() < give_up:
            if attempt:
                time.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            yield attempt
            attempt += 1

    def request(self, method: str, url: str, body: Path | None = None,
                accept: tuple[int, ...] = (), **kwargs: Any) -> httpx.Response:
        """One request, retried; ``body`` is a file streamed afresh on every attempt. A
        4xx raises, but those in ``accept``, which are returned."""
        error: Exception | None = None
        for _ in self.retrying():
            try:
                if body is None:
                    response = self.client.request(method, url, **kwargs)
                else:
                    with open(body, "rb") as f:
                        response = self.client.request(method, url, content=_chunks(f),
                                                       **kwargs)
            except httpx.TransportError as exc:
                error = exc
                continue
            if response.status_code in accept:
                return response
            if response.status_code < 500:
                return _checked(response)
            error = WeightsError(f"{method} {url}: {response.status_code} {response.text}")
        raise WeightsError(f"{method} {url} failed after {self.retries} retries"
                           f"{f' and {self.retry_for:.0f} s' if self.retry_for else ''}: {error}")

    def close(self) -> None:
        self.client.close()


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        if response.status_code == 404:
            raise _Gone(f"{response.request.url.path}: {detail}")
        raise WeightsError(f"{response.request.method} {response.request.url.path}: "
                           f"{response.status_code} {detail}")
    return response


class WeightClient:
    """What a RaaS node uses to follow a policy's weight stream."""

    def __init__(self, base_url: str, token: str, local_dir: Path | str, *, retries: int = 5,
                 backoff: float = 0.1, timeout: float = 30.0,
                 local_reads: bool = False) -> None:
        self.http = _Http(base_url, token, retries=retries, backoff=backoff, timeout=timeout)
        #: take files from the store's own directory when this machine sees it
        self.local_reads = local_reads
        #: files so taken
        self.local_files = 0
        self.local_dir = Path(local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        #: per policy, the version the last plan named
        self._planned: dict[str, int] = {}
        #: per policy, a version that failed verification even as a full snapshot
        self._refused: dict[str, int] = {}

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> WeightClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def latest(self, policy: str) -> int | None:
        try:
            return self.http.request("GET", f"/v1/weights/{check_policy(policy)}").json()["latest"]
        except _Gone:
            return None

    def local(self, policy: str) -> Synced | None:
        """The verified local copy, if any."""
        directory = self.local_dir / check_policy(policy)
        found = []
        if directory.is_dir():
            for p in directory.iterdir():
                if (p.name.startswith("v") and p.name[1:].isdigit()
                        and (p / MODEL_FILE).is_file() and (p / MANIFEST).is_file()):
                    found.append(Synced(int(p.name[1:]), p))
        return max(found, default=None)

    def sync(self, policy: str, target: int | None = None) -> Synced:
        """Bring the local copy to ``target`` (default: newest) and return its directory."""
        synced = self._sync(policy, target, None)
        assert synced is not None
        return synced

    def newer(self, policy: str, than: int) -> Synced | None:
        """The newest version if it is newer than ``than``, synced; else None. Costs one
        request when there is nothing new (the plan names the newest version)."""
        return self._sync(policy, None, than)

    def _sync(self, policy: str, target: int | None, newer_than: int | None) -> Synced | None:
        current = self.local(policy)
        for _ in range(3):
            have = current.version if current else None
            try:
                return self._sync_once(policy, current, target, have, newer_than)
            except (CorruptError, ValueError) as exc:
                if have is None:
                    self._refuse(policy, exc, newer_than)
                    return None
                current = None  # broken chain: the full snapshot replaces it
            except _Gone:
                continue
        raise VersionError(f"{policy}: files kept disappearing while syncing; is retention "
                           "too aggressive?")

    def _refuse(self, policy: str, exc: Exception, newer_than: int | None) -> None:
        """The planned version cannot be verified even from its full snapshot: said
        once, then passed over (``newer``) or refused (``sync``)."""
        version = self._planned.get(policy)
        if self._refused.get(policy) != version:
            log.warning("weights: %s v%s failed verification (%s); waiting for the next "
                        "version", policy, version, exc)
            self._refused[policy] = version if version is not None else -1
        if newer_than is None:
            raise CorruptError(f"{policy}: full snapshot of v{version} failed verification: "
                               f"{exc}") from exc

    def _sync_once(self, policy: str, current: Synced | None, target: int | None,
                   have: int | None, newer_than: int | None = None) -> Synced | None:
        params = {k: v for k, v in (("have", have), ("want", target)) if v is not None}
        plan = self.http.request("GET", f"/v1/weights/{policy}/plan", params=params).json()
        manifest, files = plan["manifest"], [FileRef.from_dict(f) for f in plan["files"]]
        version = self._planned[policy] = int(manifest["version"])
        if newer_than is not None and version <= newer_than:
            return None
        if version == self._refused.get(policy):
            if newer_than is not None:
                return None  # refused before: nothing new until the next version
            raise CorruptError(f"{policy}: v{version} failed verification before")
        if not files:
            assert current is not None
            return current
        local = _same_store(plan.get("local")) if self.local_reads else None
        if len(files) == 1:
            paths = [self._download(policy, files[0], local)]
        else:
            with ThreadPoolExecutor(min(_PARALLEL, len(files))) as pool:
                paths = list(pool.map(lambda ref: self._download(policy, ref, local), files))
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.local_dir / policy))
        try:
            if len(files) == 1 and files[0].base is None:
                if files[0].sha256 != manifest["model_sha256"]:
                    raise CorruptError("full snapshot digest differs from the manifest's model")
                _place(paths[0], staging / MODEL_FILE)
            else:
                self._rebuild(current, files, paths, staging / MODEL_FILE, manifest)
            with atomic_file(staging / MANIFEST) as f:
                f.write(json.dumps(manifest).encode())
            final = self.local_dir / policy / f"v{manifest['version']}"
            shutil.rmtree(final, ignore_errors=True)
            os.rename(staging, final)
            fsync_dir(final.parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for path in paths:
            path.unlink(missing_ok=True)
        for old in (self.local_dir / policy).iterdir():
            if old.name.startswith("v") and old != final:
                shutil.rmtree(old, ignore_errors=True)
        return Synced(int(manifest["version"]), final)

    def _rebuild(self, current: Synced | None, files: list[FileRef], paths: list[Path],
                 out: Path, manifest: dict[str, Any]) -> None:
        if files[0].base is None:
            base = st.OnDisk(paths[0])
            version, deltas = files[0].version, list(zip(files[1:], paths[1:], strict=True))
        else:
            if current is None or files[0].base != current.version:
                raise CorruptError("delta plan does not start from the local version")
            base = st.OnDisk(current.path / MODEL_FILE)
            version, deltas = current.version, list(zip(files, paths, strict=True))
        chain = []
        for ref, path in deltas:
            delta = codec.load_delta_file(path)
            if delta.base_version != version or delta.target_version != ref.version:
                raise CorruptError(f"delta {path.name} goes {delta.base_version}->"
                                   f"{delta.target_version}, expected {version}->{ref.version}")
            chain.append(delta)
            version = ref.version
        # a tensor at a time: the whole model was read into memory, patched and written
        info = st.save(out, codec.Patched(base, chain))
        if info.sha256 != manifest["model_sha256"]:
            raise CorruptError(f"rebuilt v{version} has sha256 {info.sha256}, the trainer "
                               f"published {manifest['model_sha256']}")

    def _download(self, policy: str, ref: FileRef, local: Path | None = None) -> Path:
        """A verified local file for ``ref``, resuming a partial download if one exists.

        ``local``: the store's directory, seen from this machine: the file is linked (or
        copied) from there, not downloaded and hashed again -- the store checked its
        sha256 when the version was committed, and never changes a committed file. At
        1 GB a version that is seconds of a refresh and of two shared cores.
        """
        folder = self.local_dir / policy / ".downloads"
        folder.mkdir(parents=True, exist_ok=True)
        final, part = folder / ref.sha256, folder / f"{ref.sha256}.part"
        if final.is_file():
            return final
        if local is not None and _take_local(local / policy / f"v{ref.version}" / ref.name,
                                             ref.bytes, part, final):
            self.local_files += 1
            return final
        url = f"/v1/weights/{policy}/{ref.version}/files/{ref.name}"
        error: Exception | None = None
        failed_checks = 0
        for _ in self.http.retrying():
            offset = part.stat().st_size if part.exists() else 0
            if offset >= ref.bytes:
                part.unlink(missing_ok=True)
                offset = 0
            headers = {"Range": f"bytes={offset}-", "If-Range": f'"{ref.sha256}"'} if offset \
                else {}
            digest = hashlib.sha256()
            try:
                with self.http.client.stream("GET", url, headers=headers) as response:
                    if response.status_code >= 500:
                        error = WeightsError(f"GET {url}: {response.status_code}")
                        continue
                    if response.status_code >= 400:
                        response.read()
                        _checked(response)
                    resumed = response.status_code == 206
                    if resumed:  # the bytes held, hashed once; the rest as it arrives
                        _hash_into(digest, part)
                    with open(part, "ab" if resumed else "wb") as f:
                        for chunk in response.iter_bytes():
                            f.write(chunk)
                            digest.update(chunk)
            except httpx.TransportError as exc:
                error = exc
                continue
            if part.stat().st_size == ref.bytes and digest.hexdigest() == ref.sha256:
                os.replace(part, final)
                return final
            part.unlink(missing_ok=True)
            error = CorruptError(f"{ref.name} of v{ref.version} failed sha256 verification")
            failed_checks += 1
            if failed_checks >= _VERIFY_ATTEMPTS:  # the same bytes again: damaged there
                raise CorruptError(f"{url}: {ref.name} of v{ref.version} fails its sha256 "
                                   f"check as served ({failed_checks} downloads)")
        raise WeightsError(f"downloading {url} failed: {error}")


class HttpPublishTarget:
    """A trainer's upload path to the data layer: each file in chunks, then the manifest.

    A file goes in chunks of at most :data:`~astraflow.weights.upload.CHUNK_BYTES`, or
    the smaller size the data layer states (its request size limit), read from disk one
    at a time. Each upload starts by asking how many bytes of that file (by its sha256)
    the data layer holds, so a publish cut off -- this trainer killed and publishing the
    same version again, or the data layer restarted -- sends only the rest. A chunk the
    data layer finds damaged is sent again; a commit that finds a whole file damaged
    drops it, and the file is sent again once. A data layer without chunked uploads gets
    each file in one ``PUT``, as before. With ``local_writes``, a publisher on the data
    layer's machine (it finds the key the data layer names in the store's directory) puts
    each file into the upload's place there itself -- a hard link to its staged file, or a
    copy -- instead of sending it: the data layer checks its sha256 at the commit.

    Transport errors and 5xx are retried for ``retry_for`` seconds, as the trainer's data
    client does, so a publish rides through a data layer's restart (every call is
    idempotent, the commit included) instead of failing the trainer."""

    def __init__(self, base_url: str, token: str, *, retries: int = 5,
                 timeout: float = 300.0, retry_for: float = 300.0,
                 chunk_bytes: int = CHUNK_BYTES, local_writes: bool = False) -> None:
        self.http = _Http(base_url, token, retries=retries, timeout=timeout,
                          retry_for=retry_for)
        self.local_writes = local_writes
        #: files put in place on disk rather than sent
        self.local_files = 0
        #: the largest chunk this publisher sends (the data layer may ask for less)
        self.chunk_bytes = chunk_bytes

    def staging(self, policy: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"astraflow-{check_policy(policy)}-"))

    def commit(self, policy: str, version: int, staging: Path) -> dict[str, Any]:
        manifest = json.loads((staging / MANIFEST).read_bytes())
        url = f"/v1/weights/{policy}/{version}/commit"
        for attempt in range(2):
            for name, entry in manifest["files"].items():
                self.upload(policy, version, staging / name, entry["sha256"])
            response = self.http.request("POST", url, accept=(422,),
                                         content=(staging / MANIFEST).read_bytes())
            if response.status_code != 422 or attempt:
                return _checked(response).json()
            log.warning("weights: committing %s v%s: %s; uploading again", policy, version,
                        _detail(response))
        raise AssertionError("unreachable")

    def upload(self, policy: str, version: int, path: Path, sha256: str) -> int:
        """Send the file ``path`` (whose sha256 is ``sha256``) as ``path.name`` of
        ``version``, from where the data layer's copy ends; returns the bytes sent."""
        name = path.name
        url = f"/v1/weights/{policy}/{version}/uploads/{name}"
        try:
            status = self.http.request("GET", url, params={"sha256": sha256}).json()
        except _Gone:  # a data layer from before chunked uploads
            self.http.request("PUT", f"/v1/weights/{policy}/{version}/files/{name}",
                              body=path, params={"sha256": sha256})
            return path.stat().st_size
        size = path.stat().st_size
        local = status.get("local") if self.local_writes else None
        if (_same_store(local) is not None and local is not None
                and _put_local(path, Path(str(local["path"])))):
            self.local_files += 1
            return 0  # the data layer checks its sha256 at the commit
        chunk = max(1, min(self.chunk_bytes, int(status["max_chunk_bytes"])))
        held, sent, refusals = min(int(status["bytes"]), size), 0, 0
        done = size > 0  # an empty file is one empty chunk
        with open(path, "rb") as f:
            while held < size or not done:
                f.seek(held)
                data = f.read(chunk)
                response = self.http.request(
                    "PATCH", url, accept=(409, 413, 422), content=data,
                    params={"sha256": sha256, "offset": held,
                            "chunk_sha256": hashlib.sha256(data).hexdigest()})
                if response.status_code == 200:
                    held, sent = int(response.json()["bytes"]), sent + len(data)
                    refusals, done = 0, True
                    continue
                refusals += 1
                if refusals > _CHUNK_REFUSALS:
                    raise WeightsError(f"PATCH {url}: {response.status_code} "
                                       f"{_detail(response)} ({refusals} refusals in a row)")
                if response.status_code == 409:  # the data layer holds less: resume there
                    status = self.http.request("GET", url, params={"sha256": sha256}).json()
                    held = min(int(status["bytes"]), size)
                elif response.status_code == 413:  # a proxy's limit, smaller than stated
                    if chunk <= _MIN_CHUNK:
                        raise WeightsError(f"PATCH {url}: 413 {_detail(response)}")
                    chunk = max(_MIN_CHUNK, chunk // 2)
                # 422: the chunk was damaged on the way; the loop sends it again
        return sent

    def close(self) -> None:
        self.http.close()


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(_CHUNK):
        yield chunk


def _hash_into(digest: Any, path: Path) -> None:
    with open(path, "rb") as f:
        while block := f.read(4 * _CHUNK):
            digest.update(block)


def _same_store(local: Any) -> Path | None:
    """The store's directory if this machine sees that very store (its key file holds
    the key the data layer gave), else None."""
    if not isinstance(local, dict):
        return None
    try:
        root = Path(str(local["root"]))
        if (root / LOCAL_KEY).read_text().strip() == str(local["key"]):
            return root
    except (OSError, KeyError, UnicodeDecodeError):
        pass
    return None


def _take_local(source: Path, size: int, part: Path, final: Path) -> bool:
    """``source`` (a committed file of the store, ``size`` bytes) as ``final``: a hard
    link, or a copy across file systems; False if it is gone (retention) or differs."""
    try:
        if source.stat().st_size != size:
            return False
        try:
            os.link(source, final)
        except FileExistsError:
            pass
        except OSError:  # another file system
            shutil.copyfile(source, part)
            os.replace(part, final)
        return True
    except OSError:
        part.unlink(missing_ok=True)
        return False


def _put_local(source: Path, target: Path) -> bool:
    """``source`` as the upload ``target`` in the store's directory: linked, or copied
    across file systems, then renamed into place; False if that cannot be done."""
    tmp = target.with_name(f".{target.name}.local")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
        os.replace(tmp, target)
        return True
    except OSError:
        tmp.unlink(missing_ok=True)
        return False


def _place(downloaded: Path, target: Path) -> None:
    """A verified download as ``target`` without copying its bytes: a hard link (the
    download stays until the version is in place), else a rename."""
    try:
        os.link(downloaded, target)
    except OSError:
        os.replace(downloaded, target)
