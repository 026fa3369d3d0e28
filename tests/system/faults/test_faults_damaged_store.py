"""A data-layer store damaged while the data layer was down (a file cut short, bytes
overwritten, a segment gone): ``astraflow dataflow`` stops before it serves, with one
line on the console naming the file and what is wrong, and leaves the store as it
found it -- never a silent fresh start."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from dataflow_helpers import TOKEN, group

from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.types import Task


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    """A store with 400 buffered trajectories, shut down cleanly."""
    store = tmp_path_factory.mktemp("good") / "store"
    settings = DataflowSettings(store=str(store), group_size=2, batch_size=2)
    with BackgroundServer(settings, TOKEN) as server:
        c = DataflowClient(server.url, TOKEN)
        c.register("raas")
        c.post_tasks([Task(f"t{i}", "p") for i in range(200)])
        for lease in c.lease_tasks(max_tasks=200):
            c.submit(lease, group(lease.task.task_id, [0.0, 1.0], gen_len=200))
        c.close()
    return store


def _digest(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file() and p.suffix not in (".lock",)}


def _segment(store: Path) -> Path:
    (seg,) = (store / "payloads").glob("*.seg")
    return seg


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _overwrite_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(b"\x00garbage\x00" * 8 + data[72:])


DAMAGE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "database cut short": (lambda s: s / "dataflow.sqlite3",
                           "database disk image is malformed"),
    "database header overwritten": (lambda s: s / "dataflow.sqlite3",
                                    "file is not a database"),
    "payload segment cut short": (_segment, "truncated: "),
    "payload segment gone": (_segment, "missing, and buffered trajectories point into it"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_store_stops_the_data_layer_with_one_line_naming_the_file(
        good_store, tmp_path, damage):
    store = tmp_path / "store"
    subprocess.run(["cp", "-a", str(good_store), str(store)], check=True)
    where, what = DAMAGE[damage]
    path = where(store)
    if damage == "payload segment gone":
        path.unlink()
    elif damage == "database header overwritten":
        _overwrite_header(path)
    else:
        _cut(path)
    before = _digest(store)

    proc = subprocess.run([sys.executable, "-m", "astraflow", "dataflow", "--store", str(store),
                           "--port", "0"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ASTRAFLOW_TOKEN": TOKEN})

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("astraflow: error: the data layer's store is damaged: "
                               f"{path}: {what}"), lines[0]
    assert "move the store directory away to start afresh" in lines[0]
    assert "listening" not in proc.stdout
    assert _digest(store) == before  # nothing rewritten, nothing started afresh
