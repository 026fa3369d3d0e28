"""Where a trainer's batches come from, and where it says it is alive.

The data layer serves one policy's batches by long-poll; a trainer holds two at most:
the one it trains and the next, fetched on a thread of its own (with its own connection)
while the current one trains, composed for the version it will be trained at, so
``max_staleness`` holds as without fetching ahead.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from astraflow.dataflow.client import DataflowClient
from astraflow.trainer import in_thread
from astraflow.types import Batch

log = logging.getLogger("astraflow.trainer")

#: seconds one long-poll for a batch waits before it answers "none yet"
POLL_SECONDS = 5.0


class BatchSource:
    """One policy's batches for one trainer: fetched now or ahead, then acknowledged.

    ``client`` fetches and acknowledges on the trainer's side (the publishing thread
    acknowledges with it too, so the trainer's thread uses it only once that is done);
    fetching ahead has a client of its own.
    """

    def __init__(self, url: str, token: str, policy: str, batch_size: int,
                 trainer_id: str, ahead: bool) -> None:
        self.client = DataflowClient(url, token)
        self.policy, self.batch_size, self.trainer_id = policy, batch_size, trainer_id
        self._ahead = DataflowClient(url, token) if ahead else None
        self._next: Future[Batch | None] | None = None

    def _fetch(self, client: DataflowClient, after: str | None) -> Batch | None:
        batch: Batch | None = client.get_batch(self.policy, self.batch_size,
                                                timeout=POLL_SECONDS,
                                                trainer_id=self.trainer_id, after=after)
        return batch

    def take(self, settle: Callable[[], None]) -> Batch | None:
        """The next batch: the one fetched ahead, else one fetched now, after ``settle``
        (the previous batch's acknowledgement: asked without ``after``, the data layer
        serves the oldest held batch). None if none came within a long-poll."""
        if self._next is not None:
            future, self._next = self._next, None
            return future.result()
        settle()
        return self._fetch(self.client, None)

    def fetch_ahead(self, after: str, acknowledged: Future[Any] | None) -> None:
        """Fetch the batch after ``after`` while it trains, once ``acknowledged`` (the
        previous batch's acknowledgement, if still on its way) is done. The thread is a
        daemon: a trainer that stops does not wait out a long-poll no step will use."""
        if self._ahead is None:
            return
        client = self._ahead

        def fetch() -> Batch | None:
            if acknowledged is not None:
                with contextlib.suppress(BaseException):  # the trainer raises it
                    acknowledged.result()
            return self._fetch(client, after)

        self._next = in_thread(fetch, "fetch-ahead")

    def ack(self, batch: Batch, *, wait_seconds: float, step_seconds: float,
            steps_left: int, metrics: dict[str, float]) -> dict[str, Any]:
        """Acknowledge a trained batch; the data layer's ledger of this policy's samples."""
        acked = self.client.ack_batch(batch.batch_id, wait_seconds=wait_seconds,
                                      step_seconds=step_seconds, steps_left=steps_left,
                                      metrics=metrics)
        ledger: dict[str, Any] = acked["ledger"]
        return ledger

    def ack_trained(self, batch: Batch) -> None:
        """Acknowledge a batch served again that the checkpoint already holds."""
        self.client.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=0.0)

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()


class Heartbeats:
    """Keeps the trainer registered while a long step or a long wait runs."""

    def __init__(self, url: str, token: str, node_id: str, policies: list[str],
                 interval: float = 2.0) -> None:
        self.client = DataflowClient(url, token)
        self.client.register("trainer", policies=policies, node_id=node_id)
        self.node_id, self.interval = node_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeats")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.client.heartbeat(self.node_id)
            except Exception as exc:  # the client retries; a failure here is only logged
                log.warning("heartbeat failed: %r", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()
