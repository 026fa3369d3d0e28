"""Running the data layer: in the foreground (CLI, launcher) or on a background thread.

The socket is bound before the app starts so that port 0 can pick a free port and the
real URL can be published, on stdout and in ``<store>/url``, for a launcher to read.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from astraflow.dataflow import listen
from astraflow.dataflow.app import create_app
from astraflow.dataflow.service import DataflowService
from astraflow.dataflow.settings import DataflowSettings
from astraflow.lifecycle import mark_ready
from astraflow.plugins import Registry

URL_FILE = "url"
#: the collector's thresholds in a data-layer process. Its requests allocate many
#: short-lived containers: at the default (700 allocations) the collector ran several
#: times per submission, about 8% of the server's CPU during ingest (bench/dataflow.py)
GC_THRESHOLDS = (20_000, 20, 20)


def _write_url(store: Path, url: str) -> None:
    """Atomically, so a reader never sees half a URL."""
    tmp = store / f".{URL_FILE}.{os.getpid()}"
    tmp.write_text(url + "\n")
    tmp.replace(store / URL_FILE)


class _Server(uvicorn.Server):
    """Ends the service's long polls before uvicorn waits for open requests to finish."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        app: Any = self.config.app  # the FastAPI app of create_app
        service = getattr(app.state, "service", None)
        if service is not None:
            service.close_waits()
        await super().shutdown(sockets)


def _server(app: FastAPI) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_keep_alive=75, timeout_graceful_shutdown=5)
    return _Server(config)


def serve(settings: DataflowSettings, host: str, port: int, token: str,
          registry: Registry | None = None, fd: int | None = None) -> None:
    """Serve until SIGINT/SIGTERM; prints ``astraflow dataflow listening on URL``.
    ``fd``: a listening socket the parent bound (a launcher that knew the URL first)."""
    sock = listen.bind(host, port) if fd is None else listen.inherited(fd)
    address = listen.url(host, sock)
    server = _server(create_app(settings, token, registry=registry))
    # what start-up built (the app, the state loaded from the store) lives as long as
    # the process: the collector need never scan it again
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            _write_url(settings.store_path, address)
            mark_ready()  # a launcher restarts a data layer that dies from here on
            print(f"astraflow dataflow listening on {address}", flush=True)
        await task

    _run_loop(main())
    if not server.started:
        sys.exit(1)


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop where it is installed (uvicorn's ``standard`` extra brings
    it on Linux and macOS; each request's loop work costs less), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


class BackgroundServer:
    """The data layer on a thread of this process (tests, an in-process launcher).

    >>> with BackgroundServer(settings, token) as srv:
    ...     DataflowClient(srv.url, token).status()
    """

    def __init__(self, settings: DataflowSettings, token: str, host: str = "127.0.0.1",
                 port: int = 0, registry: Registry | None = None) -> None:
        self.settings = settings
        self.app = create_app(settings, token, registry=registry)
        self._sock = listen.bind(host, port)
        self.url = listen.url(host, self._sock)
        self._server = _server(self.app)
        self._thread = threading.Thread(target=self._run, name="dataflow-server", daemon=True)
        self._error: BaseException | None = None

    @property
    def service(self) -> DataflowService:
        service: DataflowService = self.app.state.service
        return service

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # surfaced by start()
            self._error = exc

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        give_up = time.monotonic() + timeout
        while not self._server.started:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"dataflow server failed to start: {self._error}")
            if time.monotonic() > give_up:
                raise TimeoutError("dataflow server did not start in time")
            time.sleep(0.01)
        _write_url(self.settings.store_path, self.url)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
