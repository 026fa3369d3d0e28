"""The weight routes on a real HTTP server, fresh for each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from weights_helpers import Server, serving

from astraflow.weights.store import WeightStore


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(WeightStore(tmp_path / "store", keep_fulls=2)) as running:
        yield running
