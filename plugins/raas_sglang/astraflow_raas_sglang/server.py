"""A supervised ``python -m sglang.launch_server`` process: started, health-checked,
restarted when it dies or stops answering, and stopped with everything it spawned.

The server runs in its own session, so stopping it signals the whole process group
(SGLang's scheduler and detokenizer processes included); on Linux it also gets
SIGTERM if the process that started it dies, so a killed node leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from astraflow_raas_sglang.errors import SGLangServerError

log = logging.getLogger("astraflow.raas.sglang")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ManagedServer:
    """One SGLang server process and its supervision loop.

    ``on_restart`` runs after every restart, before requests are let through again:
    the backend reloads the weights the crashed server had.
    """

    def __init__(self, config: Any, model_path: str, version: int,
                 on_restart: Callable[[], Awaitable[None]]) -> None:
        self.config = config
        self.model_path = model_path
        self.initial_version = version
        self.on_restart = on_restart
        self.port = config.port or free_port(config.host)
        self.url = f"http://{config.host}:{self.port}"
        log_dir = Path(config.log_dir or Path(tempfile.gettempdir()) / "astraflow-sglang")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{os.getpid()}-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.generation = 0  # bumped by every (re)start: callers tell restarts apart
        self.paused = False  # no health checks while generation is paused on purpose
        self.failure: SGLangServerError | None = None
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._health = httpx.AsyncClient(base_url=self.url, timeout=config.health_timeout)
        self._supervisor: asyncio.Task | None = None
        #: flags the backend adds (LoRA serving)
        self.extra_args: list[str] = []

    def command(self) -> list[str]:
        cfg = self.config
        cmd = [sys.executable, "-m", cfg.server_module, "--model-path", self.model_path,
               "--host", cfg.host, "--port", str(self.port),
               "--weight-version", str(self.initial_version), "--skip-tokenizer-init"]
        if cfg.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
        return cmd + self.extra_args + [str(a) for a in cfg.server_args]

    async def start(self) -> None:
        await self._launch()
        self._ready.set()
        self._supervisor = asyncio.create_task(self._supervise())

    async def _launch(self) -> None:
        preexec = _die_with_parent if sys.platform == "linux" else None
        with self.log_path.open("ab") as fh:
            self.proc = subprocess.Popen(self.command(), stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=preexec)
        self.generation += 1
        log.info("started SGLang server pid %d on %s (log %s)", self.proc.pid, self.url,
                 self.log_path)
        try:
            await self._wait_healthy()
        except BaseException:
            await self._kill()
            raise

    async def _wait_healthy(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout
        while True:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise SGLangServerError(
                    f"the SGLang server exited with code {code} while starting; "
                    f"{self.log_hint()}")
            if await self._healthy():
                return
            if loop.time() > deadline:
                raise SGLangServerError(
                    f"the SGLang server did not become healthy within "
                    f"{self.config.startup_timeout:.0f} s; {self.log_hint()}")
            await asyncio.sleep(0.25)

    async def _healthy(self) -> bool:
        try:
            return (await self._health.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False

    def log_hint(self) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            tail = []
        lines = "\n".join(f"  | {line}" for line in tail)
        return f"server log {self.log_path}" + (f", last lines:\n{lines}" if lines else "")

    async def _supervise(self) -> None:
        with contextlib.suppress(SGLangServerError):  # kept in self.failure for callers
            await self._watch()

    async def _watch(self) -> None:
        failures = 0
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.config.health_interval)
            if self._stop.is_set() or self.failure is not None:
                return
            assert self.proc is not None
            if self.proc.poll() is not None:
                failures = 0
                await self.restart(self.generation, f"exited with code {self.proc.returncode}")
            elif self.paused or self._lock.locked() or await self._healthy():
                failures = 0
            else:
                failures += 1
                if failures >= self.config.max_health_failures:
                    await self.restart(self.generation, f"failed {failures} health checks")
                    failures = 0

    async def recover(self, seen_generation: int, error: Exception) -> None:
        """After a request lost its connection: restart the server if it died.

        Returns once a server is ready (this or a concurrent caller restarted it), or
        raises if the server is alive (the error was not a crash) or cannot be restored.
        """
        if self.failure is not None:
            raise self.failure
        if self.generation == seen_generation and not await self._exited(grace=2.0):
            raise SGLangServerError(f"request to the SGLang server at {self.url} failed "
                                    f"({error!r}) and the server is still running")
        await self.restart(seen_generation, f"dropped a request ({error!r})")

    async def _exited(self, grace: float) -> bool:
        assert self.proc is not None
        try:
            await asyncio.to_thread(self.proc.wait, grace)
        except subprocess.TimeoutExpired:
            return False
        return True

    async def restart(self, seen_generation: int, reason: str) -> None:
        async with self._lock:
            if self.failure is not None:
                raise self.failure
            if self.generation != seen_generation:
                return  # someone else restarted it meanwhile
            self._ready.clear()
            if self.restarts >= self.config.max_restarts:
                self.failure = SGLangServerError(
                    f"the SGLang server {reason} after {self.restarts} restarts; giving up. "
                    f"{self.log_hint()}")
                await self._kill()
                self._ready.set()
                raise self.failure
            self.restarts += 1
            log.warning("SGLang server %s; restart %d of %d", reason, self.restarts,
                        self.config.max_restarts)
            await self._kill()
            try:
                await self._launch()
                await self.on_restart()
            except SGLangServerError as exc:
                self.failure = exc
                self._ready.set()
                raise
            self._ready.set()

    async def ready(self) -> None:
        """Wait while a restart is under way; raise if the server could not be restored."""
        await self._ready.wait()
        if self.failure is not None:
            raise self.failure

    async def _kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            if not await self._exited(grace=15.0):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait)
        # SGLang's scheduler and detokenizer share the group: none outlives the leader
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        async with self._lock:
            await self._kill()
        await self._health.aclose()
