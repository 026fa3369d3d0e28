"""A node's submissions, gathered into one request while the previous one is in flight.

A node submits each task's trajectories when its rollouts finish. One HTTP request per
task cost a busy node a third of its Python time in the HTTP client (the default job
submits ~70 tasks a second), and the data layer as much again. Here an idle node's
submission still leaves at once; the ones that finish while it is in flight go
together in the next request (``/v1/trajectories/many``), at most ``MAX_ENTRIES`` or
about ``MAX_BYTES`` of arrays each. The data layer answers each as if it had come
alone, and each caller gets its own answer or its own error.

Rollouts that finish one by one (environment latency spreads them out) would still go
one per request. Once the data layer has told the node its pace, a request leaves at
most once per the time the trainers take to consume ``LINGER_TASKS`` of the node's tasks
(at most ``MAX_LINGER``): a submission after a quiet spell still leaves at once, one
right behind another request waits that long for company.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

#: at most this many tasks' submissions in one request
MAX_ENTRIES = 64
#: a request's arrays (token ids, log-probs...) stop growing past this many bytes
MAX_BYTES = 4 * 1024 * 1024
#: while submissions trickle in, a request leaves at most once per the time the trainers
#: take to consume this many of the node's tasks ...
LINGER_TASKS = 8
#: ... and at most this many seconds after the one before it
MAX_LINGER = 0.1


def _size(body: dict[str, Any]) -> int:
    return sum(len(v) for t in body["trajectories"] for v in t.values()
               if isinstance(v, bytes)) + 256 * len(body["trajectories"])


class Submitter:
    def __init__(self, client: Any) -> None:
        self.client = client
        self._queue: deque[tuple[dict[str, Any], asyncio.Future]] = deque()
        self._draining: asyncio.Task | None = None
        #: requests sent and submissions they carried (a node's log reports the ratio)
        self.requests = 0
        self.submissions = 0
        self._last_sent = float("-inf")

    async def aclose(self) -> None:
        """Stop sending (the node is leaving): a request still retrying, whose rollouts
        were dropped, is given up rather than left pending when the loop ends."""
        if self._draining is not None and not self._draining.done():
            self._draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._draining

    def linger(self) -> float:
        """Seconds between two requests while submissions trickle in: long enough for
        ``LINGER_TASKS`` of this node's share of what the trainers consume (its pace, from
        the data layer), a small part of a step; 0 until the pace is known."""
        rate = self.client.pace.get("tasks_per_second")
        return min(MAX_LINGER, LINGER_TASKS / rate) if rate else 0.0

    async def submit(self, lease: Any, trajectories: Sequence[Any], lease_more: int = 0,
                     versions: dict[str, int] | None = None) -> dict[str, Any]:
        """What ``client.submit`` answers for this one task."""
        body = self.client.submission(lease, trajectories, lease_more=lease_more,
                                      versions=versions)
        done = asyncio.get_running_loop().create_future()
        self._queue.append((body, done))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.create_task(self._drain())
        return await done

    def _take(self) -> list[tuple[dict[str, Any], asyncio.Future]]:
        group: list[tuple[dict[str, Any], asyncio.Future]] = []
        size = 0
        while self._queue and len(group) < MAX_ENTRIES:
            size += _size(self._queue[0][0])
            if group and size > MAX_BYTES:
                break
            group.append(self._queue.popleft())
        return group

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            # a submission after a quiet spell leaves at once; one right behind another
            # request waits for company (rollouts finishing one by one, as under
            # environment latency, would each cost a request of node and data layer time)
            hold = self._last_sent + self.linger() - loop.time()
            if hold > 0 and len(self._queue) < MAX_ENTRIES:
                await asyncio.sleep(hold)
            self._last_sent = loop.time()
            group = [(body, done) for body, done in self._take() if not done.cancelled()]
            if not group:
                continue
            self.requests += 1
            self.submissions += len(group)
            try:
                if len(group) == 1:
                    results = [await self.client.submit_body(group[0][0])]
                else:
                    results = await self.client.submit_many([body for body, _ in group])
            except Exception as exc:  # the whole request failed: so did each submission
                results = [exc] * len(group)
            for (_body, done), result in zip(group, results, strict=True):
                if done.done():
                    continue
                if isinstance(result, BaseException):
                    done.set_exception(result)
                else:
                    done.set_result(result)
