"""The data layer's in-memory records (nodes, tasks, buffered items, batches) and the
small helpers its parts share.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from astraflow.dataflow.payloads import Location

log = logging.getLogger("astraflow.dataflow")
STORE_ERRORS = (OSError, sqlite3.Error)
#: the pool of a trajectory whose node registered none, or is gone (or from an old store)
UNKNOWN_POOL = "unknown"
#: counters per (policy, pool) are named "<event>_pool:" + JSON [policy, pool]
POOL_EVENTS = ("produced", "consumed", "dropped_stale")


def pool_key(event: str, policy: str, pool: str) -> str:
    # JSON: pool names are free text, so no separator could be safe
    return f"{event}_pool:" + json.dumps([policy, pool])


def stale_key(policy: str, pool: str) -> str:
    return pool_key("dropped_stale", policy, pool)


def share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


class ServiceError(Exception):
    """A request the service refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class NodeRec:
    node_id: str
    kind: str
    labels: dict[str, Any]
    state: str  # active | retired | left
    registered_at: float
    last_seen: float  # monotonic


@dataclass
class TaskRec:
    task_id: str
    task: dict[str, Any]  # the Task as issued (task_id is the ledger id)
    state: str  # pending | leased | done
    attempt: int
    node_id: str | None
    deadline: float | None  # unix time
    seq: int


class ItemRec(NamedTuple):
    """A buffered trajectory. Immutable, and a tuple of plain values: the garbage
    collector stops tracking it, so a buffer of 100k items costs its passes nothing."""

    id: int
    policy: str
    task_id: str
    group_id: str
    min_version: int
    #: where the payload lies in the payload log
    loc: Location
    #: the rollout pool of the node that produced it
    pool: str


@dataclass
class BatchRec:
    batch_id: str
    policy: str
    trainer_id: str
    items: list[int]
    replay: list[int]
    trainer_version: int
    created_at: float
    #: item id -> the advantage served, when the policy's estimator has a batch stage
    #: (None: the ones stamped at intake); recorded so that a batch served again
    #: carries the same ones
    advantages: dict[int, float] | None = None


class Remembered:
    """Ids remembered with when each was added, oldest first: whether one is known (a
    duplicate to answer as such) until :meth:`forget` lets the old ones go."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._order: deque[tuple[float, str]] = deque()

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, key: str, when: float) -> None:
        self._ids.add(key)
        self._order.append((when, key))

    def discard_last(self, key: str) -> None:
        """Take back the :meth:`add` of ``key`` just made (its commit failed)."""
        self._ids.discard(key)
        if self._order and self._order[-1][1] == key:
            self._order.pop()

    def forget(self, before: float) -> int:
        """Let go of the ids added before ``before``; how many."""
        gone = 0
        while self._order and self._order[0][0] < before:
            self._ids.discard(self._order.popleft()[1])
            gone += 1
        return gone


def log_failure(future: asyncio.Future[Any]) -> None:
    """Announcements nobody awaits (weights' on_publish) must not fail silently."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("version announcement failed: %s", future.exception())


def prom_label(value: str) -> str:
    """A Prometheus label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
