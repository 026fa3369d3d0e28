"""The state the parts of :class:`~astraflow.dataflow.service.DataflowService` share,
declared for the type checker.

The service is composed of parts -- nodes, leasing (admission), intake, batches,
versions, observability -- each a mixin that reads and writes state the service sets
up in its ``__init__`` and calls methods another part defines. A part derives from
:class:`ServiceState`, which declares that state and those methods, so each part is
checked on its own. Nothing here exists at run time: the declarations carry no values.
"""

from __future__ import annotations

import sqlite3
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from astraflow.contracts import DataAlgorithm, TaskSelector, TaskSource
    from astraflow.dataflow.autoscale import AutoscaleWindow
    from astraflow.dataflow.pacing import Pacing
    from astraflow.dataflow.records import BatchRec, ItemRec, NodeRec, TaskRec
    from astraflow.dataflow.settings import DataflowSettings
    from astraflow.dataflow.store import Store
    from astraflow.dataflow.timeline import Timeline
    from astraflow.types import Task


class ServiceState:
    """What :class:`~astraflow.dataflow.service.DataflowService` sets up, as its parts
    see it (``DataflowService.__init__`` documents each)."""

    # the run
    settings: DataflowSettings
    #: policy -> its max_staleness
    policies: dict[str, int]
    source: TaskSource | None
    algorithms: dict[str, DataAlgorithm]
    selectors: list[TaskSelector]
    store: Store
    counters: Counter[str]
    versions: dict[str, int]
    started_at: float

    # nodes and tasks
    nodes: dict[str, NodeRec]
    tasks: dict[str, TaskRec]
    done: set[str]
    ready: deque[str]
    expiry: list[tuple[float, str, int]]
    next_seq: int
    epoch: int
    index: int
    _source_iter: Iterator[Task] | None

    # trajectories and batches
    fresh: dict[str, dict[int, ItemRec]]
    replayable: dict[str, OrderedDict[int, ItemRec]]
    in_batches: dict[int, ItemRec]
    _committing: Counter[str]

    # what the service measures and reports
    reward_errors: dict[str, str]
    first_accepted: dict[str, float]
    autoscale: AutoscaleWindow
    pacing: Pacing
    timeline: Timeline
    refusals: dict[str, Counter[str]]
    steps_left: dict[str, int]

    # waiting
    loop: asyncio.AbstractEventLoop | None
    _changed: asyncio.Event | None
    _new_version: asyncio.Event | None

    if TYPE_CHECKING:
        # defined by the service
        def _pulse_changed(self) -> None: ...

        async def _wait(self, event: asyncio.Event, timeout: float) -> None: ...

        def _plugin_updates(self) -> list[tuple[str, str]]: ...

        @staticmethod
        def _save_plugins(conn: sqlite3.Connection, updates: list[tuple[str, str]]) -> None:
            ...

        def _policy(self, policy: str) -> str: ...

        def _stale(self, policy: str, min_version: int) -> bool: ...

        # defined by the nodes part
        def _active(self, node_id: str) -> NodeRec: ...

        def _orphaned(self, policy: str) -> bool: ...

        # defined by the leasing part
        def _expire(self) -> int: ...

        # defined by the batches part
        def _held(self, policy: str) -> list[BatchRec]: ...

        def _unpublished(self, policy: str, held: list[BatchRec]) -> int: ...
