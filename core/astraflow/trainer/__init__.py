"""trainer."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def distributed() -> bool:
    """Whether this process is one rank of several (started by ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def in_thread(work: Callable[[], T], name: str) -> Future[T]:
    """``work()`` on a daemon thread of its own (a trainer that stops does not wait for
    it), its result or its error in the future returned."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # raised again where the result is asked for
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True, name=name).start()
    return future
