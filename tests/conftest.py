"""Fixtures of every tier: a real data layer on 127.0.0.1 over a real SQLite store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dataflow_helpers import TOKEN

from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., BackgroundServer]]:
    """Start a data layer with settings overrides; stopped at the end of the test."""
    servers: list[BackgroundServer] = []

    def start(**overrides: Any) -> BackgroundServer:
        settings = DataflowSettings(**{"store": str(tmp_path / "store"), **overrides})
        server = BackgroundServer(settings, TOKEN).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def connect() -> Iterator[Callable[[BackgroundServer], DataflowClient]]:
    clients: list[DataflowClient] = []

    def make(server: BackgroundServer, **kw: Any) -> DataflowClient:
        client = DataflowClient(server.url, TOKEN, **kw)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
