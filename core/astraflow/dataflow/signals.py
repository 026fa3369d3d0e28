"""What long polls wait on: a lease for a change in capacity, versions or the task
queue; a batch for an arrival of its policy's trajectories; a node for a new version.

Each signal is an :class:`asyncio.Event` set and replaced when it fires, so a waiter
wakes once per change and then looks again. Made on the event loop as the server
starts; every wait ends at once (a 503 its client retries) when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from astraflow.dataflow.records import ServiceError


class Signals:
    def __init__(self, policies: Iterable[str]) -> None:
        self._policies = list(policies)
        self._changed: asyncio.Event | None = None
        #: set when a policy's new version is durable: wakes only the version long
        #: polls, which every lease and submission would otherwise wake
        self._new_version: asyncio.Event | None = None
        self._arrival: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: set when the server stops: long polls end at once
        self.closing = False

    def start(self) -> None:
        """Make the events on the running loop (before any request)."""
        self._changed = asyncio.Event()
        self._new_version = asyncio.Event()
        self._arrival = {p: asyncio.Event() for p in self._policies}
        self._locks = {p: asyncio.Lock() for p in self._policies}

    # what a waiter waits on: taken before it looks, so a change after the look wakes it

    def changed(self) -> asyncio.Event:
        assert self._changed is not None, "the data layer is not started"
        return self._changed

    def new_version(self) -> asyncio.Event:
        assert self._new_version is not None, "the data layer is not started"
        return self._new_version

    def arrival(self, policy: str) -> asyncio.Event:
        return self._arrival[policy]

    def policy_lock(self, policy: str) -> asyncio.Lock:
        """Held while a batch of ``policy`` is composed and served."""
        return self._locks[policy]

    # firing

    def pulse_changed(self) -> None:
        """Wake lease long polls: capacity, versions or the task queue changed."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def pulse_version(self) -> None:
        if self._new_version is not None:
            self._new_version.set()
            self._new_version = asyncio.Event()

    def pulse_arrival(self, policy: str) -> None:
        self._arrival[policy].set()
        self._arrival[policy] = asyncio.Event()

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        """Until ``event`` fires or ``timeout`` seconds pass."""
        if self.closing:
            raise ServiceError(503, "the data layer is shutting down; retry")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        if self.closing:
            raise ServiceError(503, "the data layer is shutting down; retry")

    def close(self) -> None:
        """End every long poll now: the server is stopping, and a poll left waiting
        would hold its shutdown for the whole grace period."""
        self.closing = True
        for event in (self._changed, self._new_version, *self._arrival.values()):
            if event is not None:
                event.set()
