"""One compute thread, many lanes: each tenant's operations in order, no tenant waiting
for another's step.

Every request that touches the model (a training client's forward_backward, optim_step,
save; a sampling client's sample) becomes an operation on a *lane*: one per training
model, one per sampler. A lane runs its operations in the order they came (the SDK
numbers them and sends the next only after the last was accepted); the thread takes
one operation from each lane with work in turn. So two tenants interleave call by call:
neither waits for the other to finish a step (there is no barrier), and a tenant that
stops sending holds nobody up.

Results are futures the server long-polls (``retrieve_future``); an operation that
fails answers with the SDK's own failure (``{"error", "category"}``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("astraflow.tinker")


@dataclass
class Outcome:
    """What a finished operation answers: a protobuf ``body`` or a ``json`` result, or an
    ``error`` of a ``category`` (``user``: the request was wrong; ``server``)."""

    body: bytes | None = None
    json: dict[str, Any] | None = None
    error: str | None = None
    category: str = "user"


@dataclass
class Pending:
    request_id: str
    lane: str
    kind: str
    done: asyncio.Future
    submitted: float = field(default_factory=time.monotonic)
    #: when the operation ran (monotonic seconds), for the timeline
    started: float | None = None
    finished: float | None = None


class Worker:
    """The compute thread and the futures it fills."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keep_seconds: float = 900.0) -> None:
        self._loop = loop
        self._lanes: collections.OrderedDict[str, collections.deque] = (
            collections.OrderedDict())
        self._cv = threading.Condition()
        self._stopping = False
        self.futures: dict[str, Pending] = {}
        self.keep_seconds = keep_seconds
        #: (lane, kind, started, finished) of the last operations, oldest first
        self.timeline: collections.deque[tuple[str, str, float, float]] = (
            collections.deque(maxlen=4096))
        self._thread = threading.Thread(target=self._run, name="tinker-compute", daemon=True)
        self._thread.start()

    def submit(self, lane: str, kind: str, work: Callable[[], Outcome]) -> Pending:
        """Queue ``work`` on ``lane``; returns its future at once."""
        pending = Pending(f"req-{uuid.uuid4().hex}", lane, kind, self._loop.create_future())
        self.futures[pending.request_id] = pending
        with self._cv:
            self._lanes.setdefault(lane, collections.deque()).append((pending, work))
            self._cv.notify()
        self._forget_old()
        return pending

    def future(self, lane: str, kind: str) -> Pending:
        """A future that no queued operation fills: an operation that serves several
        requests at once (a batch of samples) settles it with :meth:`settle`."""
        pending = Pending(f"req-{uuid.uuid4().hex}", lane, kind, self._loop.create_future())
        self.futures[pending.request_id] = pending
        return pending

    def settle(self, pending: Pending, outcome: Outcome) -> None:
        """Answer ``pending`` (from the compute thread)."""
        pending.finished = time.monotonic()
        self._loop.call_soon_threadsafe(_settle, pending.done, outcome)

    def _take(self) -> tuple[Pending, Callable[[], Outcome]] | None:
        """The next operation, round robin over the lanes with work; None when stopping."""
        with self._cv:
            while not self._stopping and not any(self._lanes.values()):
                self._cv.wait()
            if self._stopping:
                return None
            for lane in list(self._lanes):
                queue = self._lanes[lane]
                if queue:
                    self._lanes.move_to_end(lane)  # served: the others go first next time
                    return queue.popleft()
                del self._lanes[lane]
        return None

    def _run(self) -> None:
        while (item := self._take()) is not None:
            pending, work = item
            pending.started = time.monotonic()
            try:
                outcome = work()
            except Exception as exc:  # the operation fails; the thread goes on
                log.exception("tinker: %s on %s failed", pending.kind, pending.lane)
                outcome = Outcome(error=f"{pending.kind} failed on the server: {exc!r}",
                                  category="server")
            pending.finished = time.monotonic()
            self.timeline.append((pending.lane, pending.kind, pending.started,
                                  pending.finished))
            self._loop.call_soon_threadsafe(_settle, pending.done, outcome)

    def _forget_old(self) -> None:
        """Drop answered futures older than :attr:`keep_seconds` (a client that never
        polls again does not keep its results here for ever)."""
        horizon = time.monotonic() - self.keep_seconds
        old = [rid for rid, p in self.futures.items()
               if p.done.done() and p.submitted < horizon]
        for rid in old:
            del self.futures[rid]

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=30)


def _settle(future: asyncio.Future, outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)
