"""HTTP routes of the weight store, mounted by the data layer (one URL for a node).

Downloads are plain files with Range support (206, Content-Range, ETag = sha256), so
an interrupted pull resumes where it stopped. Trainers upload a version file by file
and then commit its manifest; the store checks every sha256 before the version
becomes visible, and only then is ``on_publish`` told.

A file is uploaded in chunks that fit the data layer's request size limit
(:mod:`astraflow.weights.upload`):

- ``GET /v1/weights/{policy}/{version}/uploads/{name}?sha256=<file's>`` answers
  ``{"bytes": <held>, "max_chunk_bytes": ...}``: where to resume, and how big a chunk
  may be;
- ``PATCH`` on the same path, ``?sha256=<file's>&offset=<n>&chunk_sha256=<chunk's>``,
  with the chunk as the body, writes it at ``offset`` (the bytes held: appended; fewer:
  written again from there) and answers the bytes held; a chunk whose sha256 differs
  gets 422 naming its offset, an offset past the bytes held 409 naming them.

``PUT /v1/weights/{policy}/{version}/files/{name}?sha256=`` still takes a whole file in
one request, for files under the size limit (and publishers from before chunks).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from astraflow.weights._fs import sha256_file
from astraflow.weights.errors import CorruptError, VersionError
from astraflow.weights.store import (
    MANIFEST,
    WeightStore,
    check_file_name,
    check_policy,
    parse_manifest,
)
from astraflow.weights.upload import CHUNK_BYTES, ChunkTooLargeError, OffsetError, Uploads

DEFAULT_MAX_UPLOAD_BYTES = 64 << 30
SHA256 = r"^[0-9a-fA-F]{64}$"
_UPLOAD_DIR = re.compile(r"^\.upload-v(\d+)$")


def _http_error(exc: Exception) -> HTTPException:
    if isinstance(exc, VersionError):
        status = 409 if "not newer" in str(exc) or "only deltas" in str(exc) else 404
        return HTTPException(status, str(exc))
    if isinstance(exc, CorruptError):
        return HTTPException(422, str(exc))
    return HTTPException(400, str(exc))


def weights_router(store: WeightStore, auth_dependency: Callable[..., Any],
                   on_publish: Callable[[str, int], Any] | None = None, *,
                   max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
                   max_body_bytes: int | None = None) -> APIRouter:
    """The routes over ``store``. ``max_body_bytes`` is the request size limit of the
    app that mounts them: upload chunks are kept within it (and within
    :data:`~astraflow.weights.upload.CHUNK_BYTES`); ``max_upload_bytes`` bounds a file."""
    router = APIRouter(prefix="/v1/weights", tags=["weights"],
                       dependencies=[Depends(auth_dependency)])
    uploads = Uploads(store.root)
    local_key = store.local_key()
    max_chunk = max(1, min(CHUNK_BYTES, max_body_bytes or CHUNK_BYTES))

    def guarded(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (ValueError, VersionError, CorruptError) as exc:
            raise _http_error(exc) from exc

    @router.get("")
    def list_policies() -> dict[str, Any]:
        return {"policies": {p: store.latest(p) for p in store.policies()}}

    @router.get("/{policy}")
    def policy_versions(policy: str) -> dict[str, Any]:
        versions = guarded(lambda: store.versions(policy))
        return {"policy": policy, "latest": versions[-1] if versions else None,
                "versions": versions}

    @router.get("/{policy}/plan")
    def plan(policy: str, have: int | None = None, want: int | None = None) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            files = store.plan(policy, have, want)
            target = want if want is not None else store.latest(policy)
            assert target is not None  # plan() found a latest version
            # a node on this machine that finds the key at root reads the files from disk
            return {"policy": policy, "have": have, "want": target,
                    "manifest": store.manifest(policy, target),
                    "files": [f.to_dict() for f in files],
                    "local": {"root": str(store.root.resolve()), "key": local_key}}
        if store.latest(check_policy(policy)) is None:
            raise HTTPException(404, f"policy {policy!r} has no published version")
        return guarded(build)

    @router.get("/{policy}/{version}/manifest")
    def manifest(policy: str, version: int) -> dict[str, Any]:
        return guarded(lambda: store.manifest(policy, version))

    @router.get("/{policy}/{version}/files/{name}")
    def download(policy: str, version: int, name: str) -> FileResponse:
        path, entry = guarded(lambda: store.file_path(policy, version, name))
        return FileResponse(path, media_type="application/octet-stream",
                            headers={"etag": f'"{entry["sha256"]}"',
                                     "cache-control": "public, max-age=31536000, immutable"})

    def upload_dir(policy: str, version: int) -> Path:
        return uploads.directory(policy, version)

    def file_to_upload(policy: str, version: int, name: str) -> Path:
        guarded(lambda: (check_policy(policy), check_file_name(name)))
        return upload_dir(policy, version) / name

    @router.put("/{policy}/{version}/files/{name}", status_code=201)
    async def upload(policy: str, version: int, name: str, request: Request,
                     sha256: str = Query(..., min_length=64, max_length=64)) -> dict[str, Any]:
        """A whole file in one request (one under the request size limit)."""
        path = file_to_upload(policy, version, name)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_upload_bytes:
            raise HTTPException(413, f"{name} is {declared} bytes; the limit is "
                                     f"{max_upload_bytes}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name_tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".put", dir=path.parent)
        tmp = Path(name_tmp)
        digest, size = hashlib.sha256(), 0
        try:
            with open(fd, "wb") as f:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > max_upload_bytes:
                        raise HTTPException(413, f"{name} exceeds the {max_upload_bytes}-byte "
                                                 "limit")
                    digest.update(chunk)
                    await run_in_threadpool(f.write, chunk)
            if digest.hexdigest() != sha256.lower():
                raise HTTPException(422, f"{name}: received {size} bytes with sha256 "
                                         f"{digest.hexdigest()}, expected {sha256}; upload "
                                         "again")
            await run_in_threadpool(uploads.put_whole, path.parent, name, sha256, tmp)
        finally:
            tmp.unlink(missing_ok=True)
        return {"name": name, "bytes": size, "sha256": digest.hexdigest()}

    @router.get("/{policy}/{version}/uploads/{name}")
    def upload_status(policy: str, version: int, name: str,
                      sha256: str = Query(..., pattern=SHA256)) -> dict[str, Any]:
        """How many bytes of the file with this sha256 are held, and the chunk size."""
        path = file_to_upload(policy, version, name)
        # a trainer on this machine that finds the key at root puts the file at path
        return {"name": name, "sha256": sha256.lower(), "bytes": uploads.held(path, sha256),
                "max_chunk_bytes": max_chunk, "max_file_bytes": max_upload_bytes,
                "local": {"root": str(store.root.resolve()), "key": local_key,
                          "path": str(path.resolve())}}

    @router.patch("/{policy}/{version}/uploads/{name}")
    async def upload_chunk(policy: str, version: int, name: str, request: Request,
                           sha256: str = Query(..., pattern=SHA256),
                           offset: int = Query(..., ge=0),
                           chunk_sha256: str = Query(..., pattern=SHA256)) -> dict[str, Any]:
        """One chunk of a file, checked, written at ``offset``."""
        path = file_to_upload(policy, version, name)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_chunk:
            raise HTTPException(413, f"a chunk of {name} is {declared} bytes; chunks are at "
                                     f"most {max_chunk} (max_chunk_bytes)")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > max_chunk:
                raise HTTPException(413, f"a chunk of {name} exceeds {max_chunk} bytes "
                                         "(max_chunk_bytes)")

        def write() -> int:
            got = hashlib.sha256(body).hexdigest()
            if got != chunk_sha256.lower():
                raise HTTPException(422, f"{name}: the chunk at offset {offset} ({len(body)} "
                                         f"bytes) has sha256 {got}, expected {chunk_sha256}; "
                                         "send it again")
            return uploads.write(path.parent, name, sha256, offset, body, max_upload_bytes)
        try:
            held = await run_in_threadpool(write)
        except OffsetError as exc:
            raise HTTPException(409, str(exc),
                                headers={"upload-offset": str(exc.held)}) from exc
        except ChunkTooLargeError as exc:
            raise HTTPException(413, str(exc)) from exc
        return {"name": name, "sha256": sha256.lower(), "bytes": held}

    def committed_already(policy: str, version: int, body: bytes) -> dict[str, Any] | None:
        """The manifest of ``version`` if the store already holds it as ``body`` describes:
        a commit retried because its answer was lost (the data layer died after the
        rename) succeeds again instead of failing the trainer."""
        try:
            held = store.manifest(policy, version)
            sent = parse_manifest(body, policy, version)
        except (ValueError, VersionError, CorruptError):
            return None
        return held if held == sent else None

    def verify(directory: Path, policy: str, version: int, body: bytes) -> dict[str, str]:
        """Each uploaded file's sha256, checked against the manifest; a file that fails
        is dropped (its bytes held are wrong: the publisher sends it again)."""
        manifest = parse_manifest(body, policy, version)
        verified: dict[str, str] = {}
        problems = []
        for name, entry in manifest["files"].items():
            path = directory / name
            if not path.is_file():
                continue  # the store's commit names it
            size = path.stat().st_size
            if size < entry["bytes"]:
                problems.append(f"{name} holds {size} of its {entry['bytes']} bytes")
                continue
            digest = uploads.digest(path) if size == entry["bytes"] else None
            if size == entry["bytes"] and (digest or sha256_file(path)) == entry["sha256"]:
                verified[name] = entry["sha256"]
                continue
            uploads.discard(path)
            problems.append(f"{name} does not match its sha256 and was dropped")
        if problems:
            raise CorruptError(f"{policy} v{version}: {'; '.join(problems)}; upload again")
        return verified

    def drop_passed_over(policy: str, version: int) -> None:
        """Remove upload directories of versions up to ``version``: no commit of them can
        succeed any more (versions only grow), and a 1 GB partial file must not stay."""
        with contextlib.suppress(OSError):
            for directory in (store.root / policy).iterdir():
                match = _UPLOAD_DIR.match(directory.name)
                if match and int(match.group(1)) <= version:
                    with uploads.locked(directory):
                        shutil.rmtree(directory, ignore_errors=True)
                    uploads.forget(directory)

    @router.post("/{policy}/{version}/commit", status_code=201)
    async def commit(policy: str, version: int, request: Request) -> dict[str, Any]:
        body = await request.body()
        directory = guarded(lambda: upload_dir(policy, version))
        if not directory.is_dir():
            replayed = await run_in_threadpool(committed_already, policy, version, body)
            if replayed is not None:
                if on_publish is not None:
                    on_publish(policy, version)
                return replayed
            raise HTTPException(404, f"no files uploaded for {policy} v{version}; PUT them first")

        def finish() -> dict[str, Any]:
            with uploads.locked(directory):
                verified = verify(directory, policy, version, body)
                (directory / MANIFEST).write_bytes(body)
                result: dict[str, Any] = store.commit(policy, version, directory,
                                                      verified=verified)
            uploads.forget(directory)
            drop_passed_over(policy, version)
            return result
        def refused() -> None:
            with uploads.locked(directory):
                shutil.rmtree(directory, ignore_errors=True)
            uploads.forget(directory)
        try:
            result = await run_in_threadpool(guarded, finish)
        except HTTPException as exc:
            if exc.status_code == 409:  # not newer, or deltas only from nothing held
                await run_in_threadpool(refused)
            raise
        if on_publish is not None:
            on_publish(policy, version)
        return result

    return router
