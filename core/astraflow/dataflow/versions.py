"""Versions: each policy's published weight version, and the long-polls that
wait for a newer one.

A part of :class:`~astraflow.dataflow.service.DataflowService`: the state it reads and
writes is set up there.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter
from typing import Any

from astraflow.dataflow.records import (
    ServiceError,
    log_failure,
    stale_key,
)
from astraflow.dataflow.state import ServiceState


class VersionsMixin(ServiceState):
    """Mixed into DataflowService (see the module's docstring)."""

    def announce_version(self, policy: str, version: int) -> Any:
        """Record ``policy``'s new weight version (for the weights subsystem's on_publish).

        Callable from the event loop (returns an awaitable) or from any other thread
        (blocks until the version is durable).
        """
        if self.loop is None:
            raise RuntimeError("the dataflow service is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            future = asyncio.ensure_future(self.set_version(policy, version))
            future.add_done_callback(log_failure)
            return future
        return asyncio.run_coroutine_threadsafe(self.set_version(policy, version),
                                                self.loop).result()

    async def wait_versions(self, have: dict[str, int], wait: float) -> dict[str, int]:
        """Every policy's latest version, as soon as one in ``have`` is newer than the
        version given for it, or after ``wait`` seconds: nodes learn of new weights
        the moment they are published without polling for them."""
        for policy in have:
            self._policy(policy)
        give_up = time.monotonic() + wait
        while True:
            published = self._new_version
            assert published is not None  # made as the server starts, before any request
            remaining = give_up - time.monotonic()
            if remaining <= 0 or any(self.versions[p] > v for p, v in have.items()):
                return dict(self.versions)
            await self._wait(published, remaining)

    async def set_version(self, policy: str, version: int) -> dict[str, Any]:
        self._policy(policy)
        current = self.versions[policy]
        if version < current:
            raise ServiceError(
                409, f"versions of {policy!r} only move forward: current {current}, got {version}"
            )
        if version == current:
            return {"policy": policy, "version": version, "dropped_stale": 0}
        self.versions[policy] = version
        self.timeline.publish(policy, version)
        for algo in self.algorithms.values():
            algo.on_new_version(policy, version)
        stale = [r for r in self.fresh[policy].values() if self._stale(policy, r.min_version)]
        for item in stale:
            del self.fresh[policy][item.id]
        deltas = Counter({f"dropped_stale:{policy}": len(stale)})
        deltas.update(stale_key(policy, item.pool) for item in stale)
        # consumed items too old to be replayed go as well (trained on, so not counted)
        pool = self.replayable[policy]
        too_old = [r for r in pool.values() if self._stale(policy, r.min_version)]
        for item in too_old:
            del pool[item.id]
        plugins = self._plugin_updates()

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO versions(policy, version) VALUES (?, ?) "
                "ON CONFLICT(policy) DO UPDATE SET version = excluded.version",
                (policy, version),
            )
            conn.execute("DELETE FROM items WHERE id IN (SELECT value FROM json_each(?))",
                         (json.dumps([item.id for item in stale + too_old]),))
            self._save_plugins(conn, plugins)

        await self.store.run(job, deltas)
        self.store.payloads.release(item.loc for item in stale + too_old)
        self.counters.update(deltas)
        self._pulse_changed()
        assert self._new_version is not None  # made as the server starts
        self._new_version.set()
        self._new_version = asyncio.Event()
        return {"policy": policy, "version": version, "dropped_stale": len(stale)}

    def evaluated(self, policy: str, version: int, metrics: dict[str, float]
                  ) -> dict[str, Any]:
        """An evaluator's held-out scores of ``policy`` at ``version`` (for the dashboard)."""
        self._policy(policy)
        self.timeline.evaluated(policy, version, metrics)
        return {"policy": policy, "version": version}
