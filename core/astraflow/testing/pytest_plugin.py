"""Fixtures every AstraFlow plugin's tests can use (loaded through ``pytest11``)."""

from __future__ import annotations

import pytest

from astraflow.plugins import Registry, get_registry


@pytest.fixture
def astraflow_registry() -> Registry:
    """The registry of the installed plugins, rebuilt for this test."""
    return get_registry(refresh=True)
