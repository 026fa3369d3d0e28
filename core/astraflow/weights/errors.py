"""Errors of the weights subsystem; each says what went wrong and what to do."""

from __future__ import annotations

from astraflow.errors import AstraFlowError


class WeightsError(AstraFlowError):
    """Base class of weight store, codec and transfer errors."""


class CorruptError(WeightsError, ValueError):
    """Bytes failed a checksum or a structural check; they must never reach an engine."""


class VersionError(WeightsError, ValueError):
    """A version is unknown, not newer than the latest, or not reachable."""
