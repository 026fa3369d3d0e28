"""The payload log: trajectory payloads in segment files beside the SQLite ledger.

What a user relies on: consumed trajectories give their disk space back, a damaged
payload is never served as if it were whole, a power cut under ``synchronous=NORMAL``
costs at most the payloads that had not reached the disk (counted, never silently),
and a store written before the payload log existed keeps every buffered trajectory.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from dataflow_helpers import TOKEN, group

from astraflow.dataflow import payloads as payloads_mod
from astraflow.dataflow.payloads import PayloadCorrupt, PayloadLog


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_segments_roll_and_are_deleted_once_nothing_points_into_them(tmp_path):
    log = PayloadLog(tmp_path, segment_bytes=1000)
    first = log.append([b"a" * 600, b"b" * 500])  # segment 0 is now past its size
    second = log.append([b"c" * 10])  # ...so this starts segment 1
    assert [loc[0] for loc in first + second] == [0, 0, 1]
    assert _files(tmp_path) == ["00000000.seg", "00000001.open"]
    assert log.read(first[1]) == b"b" * 500

    log.release(first[:1])
    assert "00000000.seg" in _files(tmp_path)  # one row still points into it
    log.release(first[1:])
    assert _files(tmp_path) == ["00000001.open"]
    log.release(second)
    assert _files(tmp_path) == ["00000001.open"]  # the segment being appended to stays
    log.close()
    assert _files(tmp_path) == ["00000001.seg"]
    assert not PayloadLog(tmp_path).recovering  # closed cleanly: nothing to check


def test_a_damaged_payload_is_refused_and_an_unclosed_log_is_checked(tmp_path):
    log = PayloadLog(tmp_path)
    loc, = log.append([b"x" * 4096])
    path = tmp_path / "00000000.open"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PayloadCorrupt, match="corrupt"):
        log.read(loc)
    with pytest.raises(PayloadCorrupt, match="missing"):
        log.read((7, 0, 10, 0))
    # the process "dies" here: no close
    reopened = PayloadLog(tmp_path)
    assert reopened.recovering
    assert reopened.active == 1  # never appends after a tail it cannot trust


def _fill(server, connect, tasks: int) -> dict[str, set[str]]:
    node = connect(server)
    node.register("raas")
    sent: dict[str, set[str]] = {}
    while len(sent) < tasks:
        for lease in node.lease_tasks(max_tasks=4):
            trajs = group(lease.task.task_id, [0.0, 1.0, 1.0, 0.0], gen_len=512)
            for k, t in enumerate(trajs):
                t.metadata["sample"] = f"{lease.task.task_id}/{k}"
            assert node.submit(lease, trajs)["status"] == "accepted"
            sent[lease.task.task_id] = {t.metadata["sample"] for t in trajs}
    return sent


def test_consumed_trajectories_give_their_disk_space_back(start_server, connect, monkeypatch):
    monkeypatch.setattr(payloads_mod, "SEGMENT_BYTES", 64 * 1024)
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 100}, group_size=4,
                          batch_size=8)
    _fill(server, connect, 24)
    trainer = connect(server)
    full = trainer.status()["store"]["payload_log"]
    assert full["segments"] >= 4, full  # ~10 KB a trajectory, 96 of them, 64 KB segments
    while trainer.status()["policies"]["policy"]["buffered"]:
        batch = trainer.get_batch("policy", 8, timeout=5)
        trainer.ack_batch(batch.batch_id)
    after = trainer.status()["store"]["payload_log"]
    assert after["segments"] == 1, after  # only the segment still being appended to
    # a segment rolls before the append that finds it full: at most one submission over
    assert after["bytes"] < 64 * 1024 + 4 * 11_000 < full["bytes"]


def test_a_power_cut_loses_only_unsynced_payloads_and_counts_them(start_server, connect,
                                                                  tmp_path):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 100}, group_size=4,
                          batch_size=8)
    sent = _fill(server, connect, 8)
    total = 4 * len(sent)
    server.stop()
    # what a power cut leaves of a log that was never fsynced: the newest bytes are zeros
    # and the segment still looks open
    segment, = (tmp_path / "store" / "payloads").glob("*.seg")
    data = bytearray(segment.read_bytes())
    conn = sqlite3.connect(tmp_path / "store" / "dataflow.sqlite3")
    (last_off,) = conn.execute("SELECT max(off) FROM items").fetchone()
    conn.close()
    data[last_off:] = bytes(len(data) - last_off)
    segment.with_suffix(".open").write_bytes(bytes(data))
    segment.unlink()

    server = start_server(task={"name": "arithmetic"}, policies={"policy": 100}, group_size=4,
                          batch_size=8)
    trainer = connect(server)
    st = trainer.status()
    assert st["trajectories"]["lost"] == 1
    assert st["trajectories"]["accepted"] == total  # the ledger says what was accepted
    assert st["policies"]["policy"]["buffered"] == total - 1
    batch = trainer.get_batch("policy", total - 1, timeout=5)
    served = {i.trajectory.metadata["sample"] for i in batch.items}
    assert len(served) == total - 1 and served < set().union(*sent.values())
    metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert 'astraflow_trajectories_total{policy="policy",event="lost"} 1' in metrics.text


def test_a_store_from_before_the_payload_log_keeps_its_buffer(start_server, connect, tmp_path):
    server = start_server(task={"name": "arithmetic"}, policies={"policy": 100}, group_size=4,
                          batch_size=8)
    sent = _fill(server, connect, 4)
    server.stop()
    # rewrite the store in the old layout: payloads inside the items table, no log
    store = tmp_path / "store"
    log = PayloadLog(store / "payloads")
    conn = sqlite3.connect(store / "dataflow.sqlite3")
    rows = conn.execute("SELECT id, policy, task_id, group_id, state, batch_id, min_version, "
                        "seg, off, len, crc FROM items").fetchall()
    conn.executescript("""
        DROP TABLE items;
        CREATE TABLE items(
            id INTEGER PRIMARY KEY, policy TEXT NOT NULL, task_id TEXT NOT NULL,
            group_id TEXT NOT NULL, state INTEGER NOT NULL, batch_id TEXT,
            min_version INTEGER NOT NULL, payload BLOB NOT NULL);
    """)
    conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     [(*row[:7], log.read(tuple(row[7:]))) for row in rows])
    conn.commit()
    conn.close()
    log.close()
    for path in (store / "payloads").iterdir():
        path.unlink()

    server = start_server(task={"name": "arithmetic"}, policies={"policy": 100}, group_size=4,
                          batch_size=8)
    trainer = connect(server)
    batch = trainer.get_batch("policy", 4 * len(sent), timeout=5)
    assert {i.trajectory.metadata["sample"] for i in batch.items} == set().union(*sent.values())
    assert all(len(i.trajectory.tokens) == 3 + 512 for i in batch.items)
    trainer.ack_batch(batch.batch_id)
    assert trainer.status()["store"]["payload_log"]["segments"] == 1


def test_a_submission_of_more_payloads_than_one_writev_takes_is_written_whole(tmp_path):
    log = PayloadLog(tmp_path)
    payloads = [bytes([i % 251]) * (i % 7 + 1) for i in range(3000)]
    locations = log.append(payloads)
    assert [log.read(loc) for loc in locations] == payloads
