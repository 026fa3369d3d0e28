"""Versions: each policy's published weight version and its staleness bound.

A sample generated from version ``v`` of a policy is trainable while the policy's
version is at most ``v + max_staleness``; a sample with no trained token
(``min_version < 0``) never goes stale.
"""

from __future__ import annotations

import sqlite3

from astraflow.dataflow.records import ServiceError


class Versions:
    def __init__(self, max_staleness: dict[str, int]) -> None:
        self._max_staleness = dict(max_staleness)
        self._versions = dict.fromkeys(self._max_staleness, 0)

    def load(self, conn: sqlite3.Connection) -> None:
        for policy, version in conn.execute("SELECT policy, version FROM versions"):
            if policy in self._versions:
                self._versions[policy] = version

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
        return self._max_staleness[policy]

    def stale(self, policy: str, min_version: int) -> bool:
        return (min_version >= 0
                and self._versions[policy] - min_version > self._max_staleness[policy])

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
