"""The SGLang rollout backend: token in, token out over SGLang's native HTTP API.

SGLang batches concurrent requests itself (continuous batching), so ``generate`` is one
``POST /generate`` per request, ``n`` samples included. Weight refreshes go through
``/pause_generation``, ``/update_weights_from_disk`` (with ``weight_version``) and
``/continue_generation``; this side also holds new requests and drains in-flight ones
first, so no generation is cut short or mixes two weight versions.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import uuid
from typing import Any

import httpx

from astraflow.contracts import RolloutBackend
from astraflow.errors import ConfigError
from astraflow.types import Generation, GenerationRequest
from astraflow_raas_sglang.errors import INSTALL_HINT, SGLangServerError, SGLangUnavailableError
from astraflow_raas_sglang.protocol import (
    PAUSE_MODES,
    generate_payload,
    json_body,
    parse_generations,
    weights_payload,
)
from astraflow_raas_sglang.server import ManagedServer


class SGLangRolloutBackend(RolloutBackend):
    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.server: ManagedServer | None = None
        self.url = ""
        self._http: httpx.AsyncClient | None = None
        self._open = asyncio.Event()
        self._idle = asyncio.Event()
        self._inflight = 0
        self._loaded: tuple[str, int] | None = None  # reapplied after a restart

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Starting SGLang's own server needs SGLang here; attaching by ``url`` or
        starting another ``server_module`` does not."""
        if config.pause_mode not in PAUSE_MODES:
            raise ConfigError(f"raas.pause_mode={config.pause_mode!r}: use one of "
                              f"{', '.join(PAUSE_MODES)}")
        needs_sglang = not config.url and config.server_module.startswith("sglang.")
        if needs_sglang and importlib.util.find_spec("sglang") is None:
            raise SGLangUnavailableError(INSTALL_HINT)

    async def start(self) -> None:
        if self.config.url:
            self.url = self.config.url.rstrip("/")
        else:
            self.server = ManagedServer(self.config, self.model_path, self.version,
                                        self._reload_after_restart)
            self.url = self.server.url
        self._http = httpx.AsyncClient(base_url=self.url, timeout=self.config.request_timeout)
        if self.server is not None:
            await self.server.start()
        else:
            await self._call("GET", "/get_model_info")
        self._open.set()
        self._idle.set()

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        if self._http is None:
            raise RuntimeError("SGLangRolloutBackend.generate called before start()")
        await self._open.wait()
        self._inflight += 1
        self._idle.clear()
        try:
            return await self._generate(request)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _generate(self, request: GenerationRequest) -> list[Generation]:
        assert self._http is not None
        payload = generate_payload(request, uuid.uuid4().hex)
        while True:  # bounded: recover() raises once the restarts are used up
            seen = 0
            if self.server is not None:
                await self.server.ready()
                seen = self.server.generation
            try:
                resp = await self._http.post("/generate", json=payload)
            except httpx.TransportError as exc:
                if self.server is None:
                    raise SGLangServerError(
                        f"SGLang server at {self.url} failed during /generate: {exc!r}"
                    ) from exc
                await self.server.recover(seen, exc)
                continue
            return parse_generations(json_body(resp, "/generate"), request.n, self.version)

    async def load_weights(self, path: str, version: int) -> None:
        path = os.path.abspath(path)
        await self._update_weights(path, version)
        self.version = version
        self._loaded = (path, version)

    async def _update_weights(self, path: str, version: int) -> None:
        body = await self._call("POST", "/update_weights_from_disk",
                                weights_payload(path, version))
        if not (isinstance(body, dict) and body.get("success")):
            raise SGLangServerError(f"SGLang refused the weights at {path}: {body}")

    async def _reload_after_restart(self) -> None:
        """A restarted server starts from the base model: give it the weights it had."""
        if self._loaded is not None:
            await self._update_weights(*self._loaded)

    async def pause(self) -> None:
        self._open.clear()
        await self._idle.wait()
        if self.server is not None:
            self.server.paused = True
        await self._call("POST", "/pause_generation", {"mode": self.config.pause_mode})

    async def resume(self) -> None:
        try:
            await self._call("POST", "/continue_generation", {})
        finally:
            if self.server is not None:
                self.server.paused = False
            self._open.set()

    async def _call(self, method: str, route: str, payload: dict | None = None) -> Any:
        assert self._http is not None
        try:
            resp = await self._http.request(method, route, json=payload)
        except httpx.TransportError as exc:
            hint = f"; {self.server.log_hint()}" if self.server is not None else ""
            raise SGLangServerError(
                f"no answer from the SGLang server at {self.url}{route}: {exc!r}{hint}"
            ) from exc
        return json_body(resp, route)

    async def shutdown(self) -> None:
        if self.server is not None:
            await self.server.stop()
        if self._http is not None:
            await self._http.aclose()
