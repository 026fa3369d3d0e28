"""Publishing versions larger than a request: chunked, resumable uploads over real HTTP.

The data layer limits every request's body (``dataflow.max_body_bytes``); a version's
file larger than that goes in chunks that fit it, each checked on arrival, and a publish
cut off midway -- the trainer killed, or the data layer -- sends only what is missing.
Limits here are small (256 KiB - 1 MiB) so that files of a few MiB show it quickly.
"""

from __future__ import annotations

import hashlib
import json

import httpx
import numpy as np
import pytest
from weights_helpers import TOKEN, _free_port, same, serving, step

from astraflow.weights import safetensors_io as st
from astraflow.weights.client import HttpPublishTarget, WeightClient
from astraflow.weights.errors import WeightsError
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.store import (
    MANIFEST,
    MODEL_FILE,
    WeightStore,
    build_version,
    delta_name,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 256 << 10
CHUNKS = ("PATCH", f"/uploads/{MODEL_FILE}")


def model_of(mib: float, seed: int = 0) -> dict[str, st.Tensor]:
    """One bf16 tensor of about ``mib`` MiB (and a small one beside it)."""
    rng = np.random.default_rng(seed)
    rows = int(mib * 512)
    return {"model.embed_tokens.weight": st.bf16_from_float32(rng.normal(0, 0.02, (rows, 1024))),
            "model.norm.weight": st.Tensor.from_array(np.ones(1024, dtype=np.float32))}


def model_bytes(tensors: dict[str, st.Tensor]) -> int:
    return st.digest(tensors).bytes


def synced(url: str, tmp_path, policy: str = "p") -> tuple[int, dict[str, st.Tensor]]:
    with WeightClient(url, TOKEN, tmp_path / "node") as client:
        version, path = client.sync(policy)
    return version, st.load(path / MODEL_FILE)[0]


def test_a_version_larger_than_the_data_layers_body_limit_publishes_and_syncs(
        start_server, tmp_path):
    """The data layer itself (its app, its 1 MiB request limit): a 3 MiB snapshot and
    the delta after it publish, and a node syncs them bit for bit."""
    server = start_server(max_body_bytes=1 << 20)
    first = model_of(3)
    assert model_bytes(first) > 1 << 20
    target = HttpPublishTarget(server.url, TOKEN)
    publisher = WeightPublisher(target, "policy", full_every=10)
    publisher.publish(1, first)
    second = step(first, seed=2, fraction=0.001)
    manifest = publisher.publish(2, second)
    target.close()
    assert list(manifest["files"]) == [delta_name(1)]  # the delta went the same way
    status = httpx.get(f"{server.url}/v1/weights/policy/3/uploads/{MODEL_FILE}",
                       params={"sha256": "0" * 64}, headers=AUTH).json()
    assert status["max_chunk_bytes"] == 1 << 20 and status["bytes"] == 0
    with WeightClient(server.url, TOKEN, tmp_path / "node") as client:
        assert client.sync("policy", 1).version == 1
        version, path = client.sync("policy")
    assert version == 2 and same(st.load(path / MODEL_FILE)[0], second)


def test_the_body_limit_still_refuses_oversized_requests(start_server):
    """Chunks do not lift the limit: any other request over it, and a weight file sent
    whole or as one chunk over it, still gets 413."""
    server = start_server(max_body_bytes=1 << 20)
    body = b"x" * ((1 << 20) + 1)
    tasks = httpx.post(f"{server.url}/v1/tasks", content=body,
                       headers={**AUTH, "Content-Type": "application/json"})
    assert tasks.status_code == 413 and "exceeds 1048576 bytes" in tasks.json()["detail"]
    sha = hashlib.sha256(body).hexdigest()
    whole = httpx.put(f"{server.url}/v1/weights/policy/1/files/{MODEL_FILE}",
                      params={"sha256": sha}, content=body, headers=AUTH)
    assert whole.status_code == 413
    chunk = httpx.patch(f"{server.url}/v1/weights/policy/1/uploads/{MODEL_FILE}",
                        params={"sha256": sha, "offset": 0, "chunk_sha256": sha},
                        content=body, headers=AUTH)
    assert chunk.status_code == 413


def test_chunks_follow_the_servers_limit_and_are_read_one_at_a_time(tmp_path):
    store = WeightStore(tmp_path / "store")
    model = model_of(1.2)
    size = model_bytes(model)
    with serving(store, max_body_bytes=LIMIT, max_upload_bytes=64 << 20) as server:
        target = HttpPublishTarget(server.url, TOKEN)
        WeightPublisher(target, "p").publish(1, model)
        target.close()
        chunks = [(status, n) for m, p, status, n in server.wrapper.requests
                  if (m, p.rsplit("/", 2)[-2]) == ("PATCH", "uploads")]
        assert [s for s, _ in chunks] == [200] * (-(-size // LIMIT))
        assert max(n for _, n in chunks) == LIMIT and sum(n for _, n in chunks) == size
        assert not [p for m, p, _, _ in server.wrapper.requests if m == "PUT"]
        assert server.published == [("p", 1)]
        version, got = synced(server.url, tmp_path)
    assert version == 1 and same(got, model)


def test_a_publish_cut_off_midway_sends_only_the_rest_when_published_again(tmp_path):
    """The trainer dies after two chunks; restarted, it publishes the same version and
    the data layer's partial file is kept: only the remaining bytes travel."""
    store = WeightStore(tmp_path / "store")
    model = model_of(1.2)
    size = model_bytes(model)
    with serving(store, max_body_bytes=LIMIT, max_upload_bytes=64 << 20) as server:
        server.wrapper.refuse_after[CHUNKS] = 2
        dying = HttpPublishTarget(server.url, TOKEN, retries=0, retry_for=0)
        with pytest.raises(WeightsError, match="503"):
            WeightPublisher(dying, "p").publish(1, model)
        dying.close()
        assert server.wrapper.received(*CHUNKS) == 2 * LIMIT
        assert store.latest("p") is None
        del server.wrapper.refuse_after[CHUNKS]
        server.wrapper.requests.clear()

        target = HttpPublishTarget(server.url, TOKEN)
        manifest = WeightPublisher(target, "p").publish(1, model)
        target.close()
        assert server.wrapper.received(*CHUNKS) == size - 2 * LIMIT
        assert manifest["files"][MODEL_FILE]["sha256"] == st.digest(model).sha256
        assert server.published == [("p", 1)]
        version, got = synced(server.url, tmp_path)
    assert version == 1 and same(got, model)


def test_a_data_layer_restarted_midway_resumes_from_its_partial_file(tmp_path):
    """The data layer is stopped after two chunks arrived and started again on the same
    store: the partial file on disk counts, and the version commits with its sha256
    checked from disk (the digest taken as chunks arrived died with the process)."""
    model = model_of(1.2)
    size = model_bytes(model)
    port = _free_port()
    with serving(WeightStore(tmp_path / "store"), port, max_body_bytes=LIMIT,
                 max_upload_bytes=64 << 20) as server:
        server.wrapper.refuse_after[CHUNKS] = 2
        cut = HttpPublishTarget(server.url, TOKEN, retries=0, retry_for=0)
        with pytest.raises(WeightsError):
            WeightPublisher(cut, "p").publish(1, model)
        cut.close()
    with serving(WeightStore(tmp_path / "store"), port, max_body_bytes=LIMIT,
                 max_upload_bytes=64 << 20) as server:
        status = httpx.get(f"{server.url}/v1/weights/p/1/uploads/{MODEL_FILE}",
                           params={"sha256": st.digest(model).sha256}, headers=AUTH).json()
        assert status["bytes"] == 2 * LIMIT and status["max_chunk_bytes"] == LIMIT
        target = HttpPublishTarget(server.url, TOKEN)
        WeightPublisher(target, "p").publish(1, model)
        target.close()
        assert server.wrapper.received(*CHUNKS) == size - 2 * LIMIT
        assert server.store.manifest("p", 1)["model_sha256"] == st.digest(model).sha256
        version, got = synced(server.url, tmp_path)
    assert version == 1 and same(got, model)


def test_a_partial_file_damaged_while_the_data_layer_was_down_is_sent_again(tmp_path):
    """Bytes held that went bad on disk fail the whole file's check at commit: the data
    layer drops them, and the publisher sends the file again instead of failing."""
    model = model_of(1.2)
    size = model_bytes(model)
    port = _free_port()
    root = tmp_path / "store"
    with serving(WeightStore(root), port, max_body_bytes=LIMIT,
                 max_upload_bytes=64 << 20) as server:
        server.wrapper.refuse_after[CHUNKS] = 2
        cut = HttpPublishTarget(server.url, TOKEN, retries=0, retry_for=0)
        with pytest.raises(WeightsError):
            WeightPublisher(cut, "p").publish(1, model)
        cut.close()
    partial = root / "p" / ".upload-v1" / MODEL_FILE
    data = bytearray(partial.read_bytes())
    data[LIMIT + 10] ^= 0xFF
    partial.write_bytes(bytes(data))
    with serving(WeightStore(root), port, max_body_bytes=LIMIT,
                 max_upload_bytes=64 << 20) as server:
        target = HttpPublishTarget(server.url, TOKEN)
        WeightPublisher(target, "p").publish(1, model)
        target.close()
        commits = [s for m, p, s, _ in server.wrapper.requests if p.endswith("/commit")]
        assert commits == [422, 201]
        assert server.wrapper.received(*CHUNKS) == (size - 2 * LIMIT) + size
        version, got = synced(server.url, tmp_path)
    assert version == 1 and same(got, model)


def test_a_chunk_damaged_on_the_way_gets_422_and_is_sent_again(tmp_path):
    model = model_of(1.2)
    with serving(WeightStore(tmp_path / "store"), max_body_bytes=LIMIT,
                 max_upload_bytes=64 << 20) as server:
        server.wrapper.corrupt[CHUNKS] = 1
        target = HttpPublishTarget(server.url, TOKEN)
        WeightPublisher(target, "p").publish(1, model)
        target.close()
        chunks = [s for m, p, s, _ in server.wrapper.requests
                  if m == CHUNKS[0] and p.endswith(CHUNKS[1])]
        assert chunks[:2] == [422, 200] and set(chunks[2:]) == {200}
        assert server.published == [("p", 1)]
        version, got = synced(server.url, tmp_path)
    assert version == 1 and same(got, model)


def test_bad_chunks_get_clear_4xx(server):
    """What a publisher is told: a damaged chunk names its offset (422), a chunk past
    the bytes held names how many are held (409); a chunk sent again from an earlier
    offset rewrites from there (a retried request whose answer was lost)."""
    data = bytes(range(256)) * 64
    sha = hashlib.sha256(data).hexdigest()
    url = f"{server.url}/v1/weights/p/1/uploads/{MODEL_FILE}"

    def send(offset: int, chunk: bytes, chunk_sha: str | None = None) -> httpx.Response:
        return httpx.patch(url, content=chunk, headers=AUTH, params={
            "sha256": sha, "offset": offset,
            "chunk_sha256": chunk_sha or hashlib.sha256(chunk).hexdigest()})

    first, second = data[:4096], data[4096:8192]
    assert send(0, first).json()["bytes"] == 4096
    damaged = send(4096, second, chunk_sha=hashlib.sha256(b"other").hexdigest())
    assert damaged.status_code == 422
    assert "chunk at offset 4096" in damaged.json()["detail"]
    ahead = send(8192, data[8192:])
    assert ahead.status_code == 409 and ahead.headers["upload-offset"] == "4096"
    assert "resume at offset 4096" in ahead.json()["detail"]
    assert send(4096, second).json()["bytes"] == 8192
    assert send(4096, second).json()["bytes"] == 8192  # the same chunk again: no harm
    assert send(8192, data[8192:]).json()["bytes"] == len(data)
    assert httpx.get(url, params={"sha256": sha}, headers=AUTH).json()["bytes"] == len(data)
    # another file's bytes held count as none for this one
    other = hashlib.sha256(b"another file").hexdigest()
    assert httpx.get(url, params={"sha256": other}, headers=AUTH).json()["bytes"] == 0
    bad = httpx.patch(url, content=b"x", headers=AUTH,
                      params={"sha256": "xyz", "offset": -1, "chunk_sha256": sha})
    assert bad.status_code == 422  # malformed parameters
    assert httpx.get(url.replace("/p/", "/bad name/"), params={"sha256": sha},
                     headers=AUTH).status_code == 400
    assert httpx.get(url, params={"sha256": sha}).status_code == 401


def test_a_publisher_sending_whole_files_still_commits(server, tmp_path):
    """The single-request PUT stays for small files and publishers from before chunks."""
    staging = server.store.staging("p")
    manifest = build_version(staging, "p", 1, model_of(0.1), full=True)
    for name, entry in manifest["files"].items():
        put = httpx.put(f"{server.url}/v1/weights/p/1/files/{name}", headers=AUTH,
                        params={"sha256": entry["sha256"]}, content=(staging / name).read_bytes())
        assert put.status_code == 201, put.text
    commit = httpx.post(f"{server.url}/v1/weights/p/1/commit", headers=AUTH,
                        content=(staging / MANIFEST).read_bytes())
    assert commit.status_code == 201, commit.text
    assert server.store.versions("p") == [1] and server.published == [("p", 1)]


def test_a_data_layer_without_chunked_uploads_gets_whole_files(tmp_path):
    """A data layer from before chunks answers 404 to the upload routes: the publisher
    PUTs each file whole, as it used to."""
    with serving(WeightStore(tmp_path / "store"), max_upload_bytes=64 << 20) as server:
        inner = server.wrapper.app

        async def old(scope, receive, send):
            if scope["type"] == "http" and "/uploads/" in scope["path"]:
                body = json.dumps({"detail": "Not Found"}).encode()
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
            await inner(scope, receive, send)

        server.wrapper.app = old
        target = HttpPublishTarget(server.url, TOKEN)
        WeightPublisher(target, "p").publish(1, model_of(0.1))
        target.close()
        puts = [(p, s) for m, p, s, _ in server.wrapper.requests if m == "PUT"]
        assert puts == [(f"/v1/weights/p/1/files/{MODEL_FILE}", 201)]
        assert server.store.latest("p") == 1


def test_an_abandoned_partial_upload_goes_when_a_newer_version_commits(tmp_path):
    """A trainer that died mid-upload and resumed from an earlier checkpoint publishes
    later versions: the partial file of the version it never finished is removed."""
    root = tmp_path / "store"
    with serving(WeightStore(root), max_body_bytes=LIMIT, max_upload_bytes=64 << 20) as server:
        server.wrapper.refuse_after[CHUNKS] = 1
        cut = HttpPublishTarget(server.url, TOKEN, retries=0, retry_for=0)
        with pytest.raises(WeightsError):
            WeightPublisher(cut, "p").publish(3, model_of(0.6))
        cut.close()
        assert (root / "p" / ".upload-v3" / MODEL_FILE).stat().st_size == LIMIT
        del server.wrapper.refuse_after[CHUNKS]
        target = HttpPublishTarget(server.url, TOKEN)
        WeightPublisher(target, "p").publish(4, model_of(0.6, seed=1))
        target.close()
    assert server.store.versions("p") == [4]
    assert not [p.name for p in (root / "p").iterdir() if p.name.startswith(".upload")]


def test_bytes_replaced_on_disk_after_their_upload_fail_the_commit(server, tmp_path):
    """The sha256 taken as chunks arrive vouches only for the file it was taken over: a
    file replaced on disk before the commit is hashed again, fails, and is dropped."""
    staging = server.store.staging("p")
    manifest = build_version(staging, "p", 1, model_of(0.2), full=True)
    entry = manifest["files"][MODEL_FILE]
    data = (staging / MODEL_FILE).read_bytes()
    url = f"{server.url}/v1/weights/p/1/uploads/{MODEL_FILE}"
    for offset in range(0, len(data), 64 << 10):
        chunk = data[offset:offset + (64 << 10)]
        sent = httpx.patch(url, content=chunk, headers=AUTH, params={
            "sha256": entry["sha256"], "offset": offset,
            "chunk_sha256": hashlib.sha256(chunk).hexdigest()})
        assert sent.status_code == 200, sent.text
    held = server.store.root / "p" / ".upload-v1" / MODEL_FILE
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    (held.parent / "replacement").write_bytes(bytes(damaged))
    (held.parent / "replacement").rename(held)
    commit = httpx.post(f"{server.url}/v1/weights/p/1/commit", headers=AUTH,
                        content=(staging / MANIFEST).read_bytes())
    assert commit.status_code == 422
    assert "does not match its sha256 and was dropped" in commit.json()["detail"]
    status = httpx.get(url, params={"sha256": entry["sha256"]}, headers=AUTH).json()
    assert status["bytes"] == 0 and server.store.latest("p") is None
