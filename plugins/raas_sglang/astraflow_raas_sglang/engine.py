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
import shutil
import tempfile
import uuid
from typing import Any

import httpx

from astraflow.contracts import RolloutBackend
from astraflow.types import Generation, GenerationRequest
from astraflow.weights.base import copy_adapter
from astraflow_raas_sglang.errors import INSTALL_HINT, SGLangServerError, SGLangUnavailableError
from astraflow_raas_sglang.protocol import (
    generate_payload,
    json_body,
    lora_server_args,
    parse_generations,
    weights_payload,
)
from astraflow_raas_sglang.server import ManagedServer


class SGLangRolloutBackend(RolloutBackend):
    supports_adapters = True

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.server: ManagedServer | None = None
        self.url = ""
        self._http: httpx.AsyncClient | None = None
        self._open = asyncio.Event()
        self._idle = asyncio.Event()
        self._inflight = 0
        self._loaded: tuple[str, int] | None = None  # reapplied after a restart
        self._lora_args: list[str] | None = None
        self._adapters: dict[str, tuple[str, str]] = {}  # policy -> (adapter name, path)
        self._lora_dir: str | None = None

    def configure_adapters(self, max_rank: int, names: list[str]) -> None:
        self._lora_args = lora_server_args(max_rank, len(names))

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Starting SGLang's own server needs SGLang here; attaching by ``url`` or
        starting another ``server_module`` does not."""
        needs_sglang = not config.url and config.server_module.startswith("sglang.")
        if needs_sglang and importlib.util.find_spec("sglang") is None:
            raise SGLangUnavailableError(INSTALL_HINT)

    async def start(self) -> None:
        if self.config.url:
            self.url = self.config.url.rstrip("/")
        else:
            self.server = ManagedServer(self.config, self.model_path, self.version,
                                        self._reload_after_restart)
            self.server.extra_args = list(self._lora_args or [])
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
        # an adapter not loaded yet is its version 0: the base model
        adapter = self._adapters.get(request.adapter) if request.adapter else None
        version = (self.adapter_versions[request.adapter] if adapter and request.adapter
                   else self.version)
        payload = generate_payload(request, uuid.uuid4().hex, adapter[0] if adapter else None)
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
            gens = parse_generations(json_body(resp, "/generate"), request.n, version)
            if adapter:  # the server's weight_version is the base's; the adapter's is ours
                for gen in gens:
                    gen.version = version
            return gens

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

    async def load_adapter(self, name: str, path: str, version: int) -> None:
        if self._lora_args is None:
            raise RuntimeError("load_adapter before configure_adapters: the server was "
                               "started without LoRA")
        if self._lora_dir is None:
            self._lora_dir = tempfile.mkdtemp(prefix="astraflow-sglang-lora-")
        lora_name = f"{name}-v{version}"
        # a restarted server reads it again: a copy the node's weights cannot prune
        own = copy_adapter(path, self._lora_dir, lora_name)
        await self._load_lora(lora_name, own)
        old = self._adapters.get(name)
        self._adapters[name] = (lora_name, own)
        self.adapter_versions[name] = version
        if old is not None:
            await self._call("POST", "/unload_lora_adapter", {"lora_name": old[0]})
            shutil.rmtree(old[1], ignore_errors=True)

    async def _load_lora(self, lora_name: str, path: str) -> None:
        body = await self._call("POST", "/load_lora_adapter",
                                {"lora_name": lora_name, "lora_path": path})
        if not (isinstance(body, dict) and body.get("success")):
            why = body.get("error_message") if isinstance(body, dict) else body
            raise SGLangServerError(f"SGLang refused the adapter at {path}: {why}")

    async def _reload_after_restart(self) -> None:
        """A restarted server starts from the base model: give it the weights and the
        adapters it had."""
        if self._loaded is not None:
            await self._update_weights(*self._loaded)
        for lora_name, path in self._adapters.values():
            await self._load_lora(lora_name, path)

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
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
        if self.server is not None:
            await self.server.stop()
        if self._http is not None:
            await self._http.aclose()
