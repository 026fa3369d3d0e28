"""HTTP routes of the weight store, mounted by the data layer (one URL for a node).

Downloads are plain files with Range support (206, Content-Range, ETag = sha256), so
an interrupted pull resumes where it stopped. Trainers upload a version file by file
and then commit its manifest; the store checks every sha256 before the version
becomes visible, and only then is ``on_publish`` told.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from astraflow.weights.errors import CorruptError, VersionError
from astraflow.weights.store import (
    MANIFEST,
    WeightStore,
    check_file_name,
    check_policy,
    parse_manifest,
)

DEFAULT_MAX_UPLOAD_BYTES = 64 << 30


def _http_error(exc: Exception) -> HTTPException:
    if isinstance(exc, VersionError):
        status = 409 if "not newer" in str(exc) or "only deltas" in str(exc) else 404
        return HTTPException(status, str(exc))
    if isinstance(exc, CorruptError):
        return HTTPException(422, str(exc))
    return HTTPException(400, str(exc))


def weights_router(store: WeightStore, auth_dependency: Callable[..., Any],
                   on_publish: Callable[[str, int], Any] | None = None, *,
                   max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES) -> APIRouter:
    router = APIRouter(prefix="/v1/weights", tags=["weights"],
                       dependencies=[Depends(auth_dependency)])

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
            return {"policy": policy, "have": have, "want": target,
                    "manifest": store.manifest(policy, target),
                    "files": [f.to_dict() for f in files]}
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

    def upload_dir(policy: str, version: int):
        return store.root / check_policy(policy) / f".upload-v{int(version)}"

    @router.put("/{policy}/{version}/files/{name}", status_code=201)
    async def upload(policy: str, version: int, name: str, request: Request,
                     sha256: str = Query(..., min_length=64, max_length=64)) -> dict[str, Any]:
        guarded(lambda: (check_policy(policy), check_file_name(name)))
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_upload_bytes:
            raise HTTPException(413, f"{name} is {declared} bytes; the limit is "
                                     f"{max_upload_bytes}")
        directory = upload_dir(policy, version)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        digest, size = hashlib.sha256(), 0
        with open(path, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_upload_bytes:
                    f.close()
                    path.unlink(missing_ok=True)
                    raise HTTPException(413, f"{name} exceeds the {max_upload_bytes}-byte limit")
                digest.update(chunk)
                await run_in_threadpool(f.write, chunk)
        if digest.hexdigest() != sha256.lower():
            path.unlink(missing_ok=True)
            raise HTTPException(422, f"{name}: received {size} bytes with sha256 "
                                     f"{digest.hexdigest()}, expected {sha256}; upload again")
        return {"name": name, "bytes": size, "sha256": digest.hexdigest()}

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
            (directory / MANIFEST).write_bytes(body)
            return store.commit(policy, version, directory)
        try:
            result = await run_in_threadpool(guarded, finish)
        except HTTPException as exc:
            if exc.status_code == 409:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        if on_publish is not None:
            on_publish(policy, version)
        return result

    return router
