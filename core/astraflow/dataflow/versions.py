"""Versions: each policy's published weight version and its staleness bound.

A sample generated from version ``v`` of a policy is trainable while the policy's
version is at most ``v + max_staleness``; a sample with no trained token
(``min_version < 0``) never goes stale.

A policy whose ``max_staleness`` is set keeps it. Unset (None), the bound follows the
work: :data:`DERIVED_MIN` covers a typical group (admission issues a task only if its
samples would be trained within the bound), widened by the trainer steps the slow groups
take beyond it -- the 90th percentile of the recent turnarounds less their median, over
the trainer's step time with its waits left out -- up to :data:`DERIVED_MAX`. A job whose
groups all take about as long keeps the floor; one whose environment or agent makes
some groups take many steps longer gets the room to train them instead of dropping
them. Admission plans with the bound now; a sample is dropped only past the highest
bound derived so far, so what was issued under a wider bound is not thrown away when
the bound comes down.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable

from astraflow.dataflow.records import ServiceError

#: (median, 90th percentile) of the recent turnarounds, and a trainer step's seconds
Measured = tuple[tuple[float, float] | None, float | None]
#: the derived bound's floor (a job whose groups take about as long) and its ceiling
DERIVED_MIN = 3
DERIVED_MAX = 16


def derived_staleness(spread: tuple[float, float] | None, step_seconds: float | None) -> int:
    """The bound for a policy that sets none: the floor, + the whole trainer steps the slow
    groups (90th percentile) take beyond the median one."""
    if spread is None or not step_seconds:
        return DERIVED_MIN
    median, slow = spread
    steps = DERIVED_MIN + math.floor((slow - median) / step_seconds)
    return max(DERIVED_MIN, min(DERIVED_MAX, steps))


#: the ``meta`` row that keeps each derived bound's highest value across restarts
_HIGHEST = "staleness_highest"


class Versions:
    def __init__(self, max_staleness: dict[str, int | None],
                 measured: Callable[[str], Measured] | None = None) -> None:
        """``max_staleness``: per policy, its bound, or None to derive it from
        ``measured(policy)``: the turnarounds' median and 90th percentile, and the
        trainer's step seconds."""
        self._set = dict(max_staleness)
        self._measured = measured
        self._versions = dict.fromkeys(self._set, 0)
        #: per policy whose bound is derived, the highest derived so far
        self._highest = dict.fromkeys(self._set, DERIVED_MIN)

    def load(self, conn: sqlite3.Connection) -> None:
        for policy, version in conn.execute("SELECT policy, version FROM versions"):
            if policy in self._versions:
                self._versions[policy] = version
        # what was admitted under a widened bound before a restart is still trainable
        # after it, before the turnarounds are measured again
        for (value,) in conn.execute("SELECT value FROM meta WHERE key = ?", (_HIGHEST,)):
            for policy, bound in json.loads(value).items():
                if policy in self._highest:
                    self._highest[policy] = max(self._highest[policy], int(bound))

    def save(self, conn: sqlite3.Connection) -> None:
        """Keep the highest derived bounds (with each new version)."""
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                     (_HIGHEST, json.dumps(self._highest)))

    @property
    def policies(self) -> list[str]:
        return list(self._versions)

    def check(self, policy: str) -> str:
        """``policy``, if this run has it (else a 404 naming the ones it has)."""
        if policy not in self._versions:
            raise ServiceError(
                404, f"unknown policy {policy!r}; this run has {sorted(self._versions)}")
        return policy

    def __getitem__(self, policy: str) -> int:
        return self._versions[policy]

    def all(self) -> dict[str, int]:
        """Every policy's latest version (a copy)."""
        return dict(self._versions)

    def max_staleness(self, policy: str) -> int:
        """The bound now: the one set, else the one derived (see the module)."""
        bound = self._set[policy]
        if bound is not None:
            return bound
        bound = derived_staleness(*self.measured(policy))
        if bound > self._highest[policy]:
            self._highest[policy] = bound
        return bound

    def measured(self, policy: str) -> Measured:
        return self._measured(policy) if self._measured is not None else (None, None)

    def staleness_reason(self, policy: str) -> str:
        """Why the bound is what it is, in one line (``/v1/status``, the dashboard)."""
        if self._set[policy] is not None:
            return "set (policies.<name>.max_staleness)"
        spread, step = self.measured(policy)
        if spread is None or not step:
            return f"derived: {DERIVED_MIN} until turnarounds and a trainer step are measured"
        median, slow = spread
        return (f"derived: {DERIVED_MIN} + the steps of {step:.3f} s that slow groups (90th "
                f"percentile, {slow:.2f} s) take beyond the median one ({median:.2f} s): "
                f"{(slow - median) / step:.1f}; at most {DERIVED_MAX}")

    def trainable_within(self, policy: str) -> int:
        """Versions a sample may lag and still be trained: the bound set, else the
        highest derived so far (what admission may have issued under)."""
        bound = self.max_staleness(policy)
        return bound if self._set[policy] is not None else self._highest[policy]

    def stale(self, policy: str, min_version: int) -> bool:
        return (min_version >= 0
                and self._versions[policy] - min_version > self.trainable_within(policy))

    def newer(self, have: dict[str, int]) -> bool:
        """Whether any policy in ``have`` has a version past the one given for it."""
        return any(self._versions[p] > v for p, v in have.items())

    def advance(self, policy: str, version: int) -> bool:
        """Move ``policy`` to ``version``: True if it moved, False if it was there
        already; a version behind the current one is refused (409)."""
        current = self._versions[self.check(policy)]
        if version < current:
            raise ServiceError(
                409, f"versions of {policy!r} only move forward: current {current}, got {version}"
            )
        self._versions[policy] = version
        return version > current

    def undo_advance(self, policy: str, version: int) -> None:
        """The move to a version was not committed: ``policy`` is back at ``version``."""
        self._versions[policy] = version
