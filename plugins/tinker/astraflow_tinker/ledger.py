"""The service's durable record: sessions, models (tenants), their checkpoints, samplers.

One SQLite file beside the checkpoints (``<state>/ledger.sqlite``, WAL, every write
committed before it is answered), so a killed server starts again knowing every tenant,
whose key owns it, its LoRA shape and its last saved state, and every saved path a
client may load or sample. What it does not keep is a request in flight: that is the
client's to send again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL,
    finished REAL, metadata TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS models (
    model_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, owner TEXT NOT NULL,
    base_model TEXT NOT NULL, spec TEXT NOT NULL, created REAL NOT NULL,
    last_state TEXT, last_sampler TEXT, last_request REAL NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS checkpoints (
    path TEXT PRIMARY KEY, model_id TEXT NOT NULL, owner TEXT NOT NULL,
    kind TEXT NOT NULL, name TEXT NOT NULL, dir TEXT NOT NULL, created REAL NOT NULL,
    expires REAL, metadata TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS samplers (
    sampler_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, owner TEXT NOT NULL,
    base_model TEXT NOT NULL, model_path TEXT, dir TEXT, created REAL NOT NULL);
"""


def owner_of(key: str) -> str:
    """Who a key is, as the ledger records it: never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


@dataclass
class Model:
    model_id: str
    session_id: str
    owner: str
    base_model: str
    spec: dict[str, Any]
    last_state: str | None
    last_sampler: str | None
    created: float
    last_request: float
    metadata: dict[str, Any]


@dataclass
class Checkpoint:
    path: str
    model_id: str
    owner: str
    kind: str  # "weights" (weights and optimizer) | "sampler_weights"
    name: str
    dir: str
    created: float
    expires: float | None
    metadata: dict[str, Any]


@dataclass
class Sampler:
    sampler_id: str
    session_id: str
    owner: str
    base_model: str
    model_path: str | None
    dir: str | None


class Ledger:
    """The SQLite record; safe to call from the server's threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def _write(self, sql: str, args: tuple) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # sessions
    def add_session(self, session_id: str, owner: str, metadata: dict[str, Any]) -> None:
        self._write("INSERT INTO sessions (session_id, owner, created, metadata) "
                    "VALUES (?, ?, ?, ?)", (session_id, owner, time.time(),
                                            json.dumps(metadata)))

    def session_owner(self, session_id: str) -> str | None:
        rows = self._rows("SELECT owner FROM sessions WHERE session_id = ?", (session_id,))
        return rows[0][0] if rows else None

    def finish_session(self, session_id: str) -> None:
        self._write("UPDATE sessions SET finished = ? WHERE session_id = ?",
                    (time.time(), session_id))

    def session_items(self, session_id: str) -> tuple[list[str], list[str]]:
        models = [r[0] for r in self._rows(
            "SELECT model_id FROM models WHERE session_id = ? ORDER BY created", (session_id,))]
        samplers = [r[0] for r in self._rows(
            "SELECT sampler_id FROM samplers WHERE session_id = ? ORDER BY created",
            (session_id,))]
        return models, samplers

    # models
    def add_model(self, model_id: str, session_id: str, owner: str, base_model: str,
                  spec: dict[str, Any], metadata: dict[str, Any]) -> None:
        now = time.time()
        self._write("INSERT OR REPLACE INTO models (model_id, session_id, owner, base_model, "
                    "spec, created, last_request, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (model_id, session_id, owner, base_model, json.dumps(spec), now, now,
                     json.dumps(metadata)))

    def model(self, model_id: str) -> Model | None:
        rows = self._rows("SELECT model_id, session_id, owner, base_model, spec, last_state, "
                          "last_sampler, created, last_request, metadata FROM models "
                          "WHERE model_id = ?", (model_id,))
        if not rows:
            return None
        r = rows[0]
        return Model(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8],
                     json.loads(r[9]))

    def models(self, owner: str) -> list[Model]:
        ids = [r[0] for r in self._rows(
            "SELECT model_id FROM models WHERE owner = ? ORDER BY created", (owner,))]
        return [m for m in (self.model(i) for i in ids) if m is not None]

    # checkpoints
    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        c = checkpoint
        column = "last_state" if c.kind == "weights" else "last_sampler"
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO checkpoints (path, model_id, owner, kind, name, "
                    "dir, created, expires, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (c.path, c.model_id, c.owner, c.kind, c.name, c.dir, c.created,
                     c.expires, json.dumps(c.metadata)))
                self._db.execute(f"UPDATE models SET {column} = ? WHERE model_id = ?",
                                 (c.path, c.model_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def checkpoint(self, path: str) -> Checkpoint | None:
        rows = self._rows("SELECT path, model_id, owner, kind, name, dir, created, expires, "
                          "metadata FROM checkpoints WHERE path = ?", (path,))
        if not rows:
            return None
        r = rows[0]
        return Checkpoint(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8]))

    def checkpoints(self, model_id: str) -> list[Checkpoint]:
        paths = [r[0] for r in self._rows(
            "SELECT path FROM checkpoints WHERE model_id = ? ORDER BY created", (model_id,))]
        return [c for c in (self.checkpoint(p) for p in paths) if c is not None]

    # samplers
    def add_sampler(self, sampler: Sampler) -> None:
        s = sampler
        self._write("INSERT OR REPLACE INTO samplers (sampler_id, session_id, owner, "
                    "base_model, model_path, dir, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (s.sampler_id, s.session_id, s.owner, s.base_model, s.model_path, s.dir,
                     time.time()))

    def sampler(self, sampler_id: str) -> Sampler | None:
        rows = self._rows("SELECT sampler_id, session_id, owner, base_model, model_path, dir "
                          "FROM samplers WHERE sampler_id = ?", (sampler_id,))
        return Sampler(*rows[0]) if rows else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
