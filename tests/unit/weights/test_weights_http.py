"""Pulling and publishing over a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from weights_helpers import TOKEN, make_model, same, step

from astraflow.testing import wait_until
from astraflow.weights import safetensors_io as st
from astraflow.weights.client import HttpPublishTarget, WeightClient
from astraflow.weights.errors import WeightsError
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.store import MANIFEST, MODEL_FILE, delta_name


def test_trainer_uploads_and_late_joiner_catches_up(server, tmp_path):
    target = HttpPublishTarget(server.url, TOKEN)
    publisher = WeightPublisher(target, "solver", full_every=3)
    models = [make_model()]
    publisher.publish(1, models[0])
    for v in range(2, 8):
        models.append(step(models[-1], seed=v))
        publisher.publish(v, models[-1])
    target.close()
    assert server.published == [("solver", v) for v in range(1, 8)]
    assert server.store.versions("solver")[0] > 1  # retention ran
    with WeightClient(server.url, TOKEN, tmp_path / "node") as client:
        assert client.latest("solver") == 7
        version, path = client.sync("solver")
    assert version == 7
    assert same(st.load(path / MODEL_FILE)[0], models[-1])


def test_node_follows_a_delta_chain_across_versions(server, tmp_path):
    publisher = WeightPublisher(server.store, "solver", full_every=100)
    models = [make_model()]
    publisher.publish(1, models[0])
    client = WeightClient(server.url, TOKEN, tmp_path / "node")
    assert client.sync("solver").version == 1
    for v in range(2, 6):
        models.append(step(models[-1], seed=v))
        publisher.publish(v, models[-1])
    server.wrapper.log.clear()
    version, path = client.sync("solver")
    fetched = [p.rsplit("/", 1)[-1] for p, status, _ in server.wrapper.log if "/files/" in p]
    # the chain's deltas, each once (fetched concurrently, so in any order)
    assert version == 5 and sorted(fetched) == sorted(delta_name(v) for v in range(1, 5))
    assert same(st.load(path / MODEL_FILE)[0], models[-1])
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith("v")) == ["v5"]
    client.close()


@pytest.mark.parametrize("kept_from", ["a full version", "a delta"])
def test_a_delta_base_kept_on_disk_gives_the_same_chain(server, tmp_path, kept_from):
    """The trainer keeps the last version's bits in a file, not in memory: the deltas a
    node follows rebuild the same weights, whether the base came from a full snapshot
    (moved into place) or was written after a delta."""
    base = tmp_path / "trainer" / "policy.delta-base.safetensors"
    target = HttpPublishTarget(server.url, TOKEN)
    publisher = WeightPublisher(target, "solver", full_every=1 if kept_from == "a full version"
                                else 100, base_path=base)
    models = [make_model()]
    publisher.publish(1, models[0], owned=True)
    for v in range(2, 5):
        models.append(step(models[-1], seed=v))
        publisher.publish(v, models[-1], owned=True)
        assert isinstance(publisher._previous, st.OnDisk)  # nothing held in memory
        assert same(dict(publisher._previous), models[-1])
    target.close()
    stored = server.store.root / "solver"
    full = [v for v in range(2, 5) if (stored / f"v{v}" / MODEL_FILE).exists()]
    deltas = [v for v in range(2, 5) if (stored / f"v{v}" / delta_name(v - 1)).exists()]
    if kept_from == "a full version":  # (older ones may be gone: retention)
        assert 4 in full
    else:
        assert full == [] and deltas == [2, 3, 4]
    with WeightClient(server.url, TOKEN, tmp_path / "node") as client:
        version, path = client.sync("solver")
    assert version == 4 and same(st.load(path / MODEL_FILE)[0], models[-1])


def test_a_node_polling_for_newer_weights_costs_one_request_when_nothing_is_new(server,
                                                                                tmp_path):
    publisher = WeightPublisher(server.store, "p", full_every=100)
    publisher.publish(1, make_model())
    with WeightClient(server.url, TOKEN, tmp_path / "node") as client:
        server.wrapper.log.clear()
        # a node already at version 1 (say, the initial weights) downloads nothing
        assert client.newer("p", 1) is None
        assert [p for p, _, _ in server.wrapper.log] == ["/v1/weights/p/plan"]
        assert not (tmp_path / "node" / "p").exists() or not any(
            q.name.startswith("v") for q in (tmp_path / "node" / "p").iterdir())
        publisher.publish(2, step(make_model(), 2))
        version, path = client.newer("p", 1)
        assert version == 2 and (path / MODEL_FILE).is_file()
        server.wrapper.log.clear()
        assert client.newer("p", 2) is None and len(server.wrapper.log) == 1


def test_broken_chain_falls_back_to_full(server, tmp_path):
    store = server.store
    store.publish("p", 1, make_model())
    client = WeightClient(server.url, TOKEN, tmp_path / "node")
    client.sync("p")
    store.publish("p", 2, step(make_model(), 2), full=True)  # no delta: chain broken
    server.wrapper.log.clear()
    assert client.sync("p").version == 2
    assert [p.rsplit("/", 1)[-1] for p, _, _ in server.wrapper.log if "/files/" in p] == [
        MODEL_FILE]
    # a local copy damaged on disk fails verification after the deltas: full again
    store.publish("p", 3, step(store.load("p"), 3), full=False, delta_base=2)
    local = client.local("p").path / MODEL_FILE
    data = bytearray(local.read_bytes())
    data[-1] ^= 0xFF
    local.write_bytes(bytes(data))
    server.wrapper.log.clear()
    version, path = client.sync("p")
    fetched = [p.rsplit("/", 1)[-1] for p, _, _ in server.wrapper.log if "/files/" in p]
    assert version == 3 and fetched == [delta_name(2), MODEL_FILE]  # delta kept, not refetched
    assert same(st.load(path / MODEL_FILE)[0], store.load("p", 3))
    client.close()


def test_interrupted_download_resumes_with_range(server, tmp_path):
    big = {"w": st.bf16_from_float32(step(make_model(), 1)["model.embed_tokens.weight"]
                                     .to_float32().repeat(64, axis=0))}
    manifest = server.store.publish("p", 1, big)
    size = manifest["files"][MODEL_FILE]["bytes"]
    server.wrapper.cut[f"/files/{MODEL_FILE}"] = size // 3
    with WeightClient(server.url, TOKEN, tmp_path / "node", backoff=0.01) as client:
        _, path = client.sync("p")
    gets = [(status, sent) for p, status, sent in server.wrapper.log if "/files/" in p]
    assert gets == [(200, size // 3), (206, size - size // 3)]
    assert same(st.load(path / MODEL_FILE)[0], big)


def test_range_etag_and_auth(server):
    manifest = server.store.publish("p", 1, make_model())
    entry = manifest["files"][MODEL_FILE]
    url = f"{server.url}/v1/weights/p/1/files/{MODEL_FILE}"
    assert httpx.get(url).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.get(url, headers={**auth, "Range": "bytes=10-19"})
    assert r.status_code == 206 and len(r.content) == 10
    assert r.headers["content-range"] == f"bytes 10-19/{entry['bytes']}"
    assert r.headers["etag"] == f'"{entry["sha256"]}"'
    assert httpx.get(f"{server.url}/v1/weights/p/9/manifest", headers=auth).status_code == 404
    assert httpx.get(f"{server.url}/v1/weights/p/1/files/x.bin", headers=auth).status_code == 400
    assert httpx.get(f"{server.url}/v1/weights/nobody/plan", headers=auth).status_code == 404


def test_bad_uploads_get_clear_4xx(server):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{server.url}/v1/weights/p/1/files/{MODEL_FILE}"
    commit = httpx.post(f"{server.url}/v1/weights/p/1/commit", content=b"{}", headers=auth)
    assert commit.status_code == 404 and "PUT them first" in commit.json()["detail"]
    wrong = httpx.put(url, params={"sha256": "0" * 64}, content=b"abc", headers=auth)
    assert wrong.status_code == 422 and "sha256" in wrong.json()["detail"]
    body = b"x" * ((1 << 20) + 1)
    big = httpx.put(url, params={"sha256": hashlib.sha256(body).hexdigest()}, content=body,
                    headers=auth)
    assert big.status_code == 413
    ok = httpx.put(url, params={"sha256": hashlib.sha256(b"abc").hexdigest()}, content=b"abc",
                   headers=auth)
    assert ok.status_code == 201
    bad = httpx.post(f"{server.url}/v1/weights/p/1/commit", content=b"not json", headers=auth)
    assert bad.status_code == 422 and "malformed" in bad.json()["detail"]
    assert server.published == [] and server.store.latest("p") is None


def test_publishing_an_old_version_is_refused(server):
    target = HttpPublishTarget(server.url, TOKEN)
    WeightPublisher(target, "p").publish(2, make_model())
    with pytest.raises(WeightsError, match="409"):
        WeightPublisher(target, "p").publish(1, make_model())
    target.close()


def test_a_commit_sent_again_after_its_answer_was_lost_succeeds_again(server):
    """The data layer can die after making a version visible and before answering; the
    trainer's retry must then get the same answer, not 'PUT them first'."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    target = HttpPublishTarget(server.url, TOKEN)
    WeightPublisher(target, "p").publish(1, make_model())
    target.close()
    manifest = (server.store.version_dir("p", 1) / MANIFEST).read_bytes()
    again = httpx.post(f"{server.url}/v1/weights/p/1/commit", content=manifest, headers=auth)
    assert again.status_code == 201, again.text
    assert again.json() == server.store.manifest("p", 1)
    assert server.published == [("p", 1), ("p", 1)]  # announced again: idempotent
    # a different manifest for a held version is not a replay
    other = json.loads(manifest)
    name = next(iter(other["files"]))
    other["files"][name]["sha256"] = "0" * 64
    changed = httpx.post(f"{server.url}/v1/weights/p/1/commit",
                         content=json.dumps(other).encode(), headers=auth)
    assert changed.status_code == 404 and "PUT them first" in changed.json()["detail"]
    assert server.store.versions("p") == [1]




def test_a_version_damaged_on_the_server_is_refused_once_and_the_next_one_taken(
        server, tmp_path, caplog):
    """A version's files altered after publication fail their checksum as a delta and
    as a full snapshot: the node keeps its weights, says so in one line, fetches the
    damaged version no more, and takes the next version when it comes."""
    store = server.store
    first = make_model()
    store.publish("p", 1, first)
    client = WeightClient(server.url, TOKEN, tmp_path / "node", backoff=0.01)
    assert client.sync("p").version == 1
    store.publish("p", 2, step(first, 2), full=True, delta_base=1)
    for path in store.version_dir("p", 2).glob("*.safetensors"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # altered, same size
        path.write_bytes(bytes(data))

    with caplog.at_level("WARNING", logger="astraflow.weights"):
        assert client.newer("p", 1) is None
        assert client.newer("p", 1) is None  # asked again: the plan only, no download
    # (the server logs a download as its response ends, so the first call's last one
    # may land after that call returned: what follows the second plan is what counts)
    log = [p for p, _, _ in server.wrapper.log]
    plans = [i for i, p in enumerate(log) if p.endswith("/plan")]
    # the first sync, the delta chain tried, the full snapshot tried, the second ask
    assert len(plans) == 4 and [p for p in log[plans[-1]:] if "/files/" in p] == []
    said = [r.getMessage() for r in caplog.records if r.name == "astraflow.weights"]
    assert len(said) == 1 and "p v2 failed verification" in said[0], said
    assert "waiting for the next version" in said[0]
    assert client.local("p").version == 1
    with pytest.raises(WeightsError, match="v2 failed verification"):
        client.sync("p")

    third = step(store.load("p", 1), 3)
    store.publish("p", 3, third, full=True)
    version, path = client.newer("p", 1)
    assert version == 3 and same(st.load(path / MODEL_FILE)[0], third)
    client.close()


def test_a_node_on_the_store_s_machine_takes_files_from_disk(server, tmp_path):
    """With ``local_reads`` a client that sees the store's directory (its key file holds
    the key the plan names) links the files instead of downloading them: no file request,
    the same weights; one that does not see it downloads as before."""
    publisher = WeightPublisher(server.store, "p", full_every=2)
    models = [make_model()]
    publisher.publish(1, models[0])
    for v in range(2, 5):
        models.append(step(models[-1], seed=v))
        publisher.publish(v, models[-1])
    with WeightClient(server.url, TOKEN, tmp_path / "near", local_reads=True) as near:
        server.wrapper.log.clear()
        version, path = near.sync("p")
        assert version == 4 and same(st.load(path / MODEL_FILE)[0], models[-1])
        assert near.local_files >= 1
        assert not [p for p, _, _ in server.wrapper.log if "/files/" in p]
        publisher.publish(5, step(models[-1], seed=5))  # a delta on top of the local copy
        version, path = near.newer("p", 4)
        assert version == 5 and not [p for p, _, _ in server.wrapper.log if "/files/" in p]
    (server.store.root / ".local-key").write_text("another store's key")
    with WeightClient(server.url, TOKEN, tmp_path / "far", local_reads=True) as far:
        version, path = far.sync("p")
        assert version == 5 and far.local_files == 0
        # the server logs a request once its handler returns, which can be just after
        # the client has read the whole body
        wait_until(lambda: [p for p, _, _ in server.wrapper.log if "/files/" in p], 10,
                   "the far client's file download to be logged")


def test_a_trainer_on_the_store_s_machine_puts_versions_in_place(server, tmp_path, caplog):
    """With ``local_writes`` the publisher puts its files where the upload goes instead
    of sending them; the commit still checks each sha256, and a file damaged on the way
    is refused, then sent again."""
    target = HttpPublishTarget(server.url, TOKEN, local_writes=True)
    publisher = WeightPublisher(target, "p", full_every=1)
    models = [make_model()]
    publisher.publish(1, models[0])
    assert target.local_files == 1
    assert server.wrapper.received("PATCH", MODEL_FILE) == 0  # nothing sent
    with WeightClient(server.url, TOKEN, tmp_path / "node") as client:
        assert same(st.load(client.sync("p").path / MODEL_FILE)[0], models[0])
        original = target.upload

        def damaging(policy, version, path, sha256):  # the first put arrives damaged
            sent = original(policy, version, path, sha256)
            if target.local_files == 2:
                placed = next((server.store.root / policy).glob(f"*{version}*/{path.name}"))
                data = bytearray(placed.read_bytes())
                data[-1] ^= 1
                placed.unlink()
                placed.write_bytes(bytes(data))
            return sent

        target.upload = damaging
        models.append(step(models[0], seed=2))
        with caplog.at_level("WARNING"):
            publisher.publish(2, models[-1])
        assert "uploading again" in caplog.text  # refused at the commit, then put again
        assert server.wrapper.received("PATCH", MODEL_FILE) == 0
        assert same(st.load(client.sync("p").path / MODEL_FILE)[0], models[-1])
    target.close()
