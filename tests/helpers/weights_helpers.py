"""Helpers of the weights tests: tiny bf16 models and a real HTTP server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import uvicorn
from fastapi import FastAPI

from astraflow.security import BodySizeLimit, bearer_auth
from astraflow.weights.http import weights_router
from astraflow.weights.safetensors_io import Tensor, bf16_from_float32
from astraflow.weights.store import WeightStore

TOKEN = "test-token"


def make_model(seed: int = 0) -> dict[str, Tensor]:
    rng = np.random.default_rng(seed)
    return {
        "model.embed_tokens.weight": bf16_from_float32(rng.normal(0, 0.02, (64, 32))),
        "model.layers.0.mlp.up_proj.weight": bf16_from_float32(rng.normal(0, 0.02, (48, 32))),
        "model.norm.weight": Tensor.from_array(np.ones(31, dtype=np.float32)),
        "lm_head.bias": Tensor.from_array(rng.normal(size=7).astype(np.float16)),
    }


def step(model: dict[str, Tensor], seed: int, fraction: float = 0.02) -> dict[str, Tensor]:
    """A sparse update like an RL step under bf16: a few elements move by one ulp."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in model.items():
        data = t.data.copy().reshape(-1)
        hit = rng.random(data.size) < fraction
        data[hit] += np.array(1, dtype=data.dtype)
        out[name] = Tensor(t.dtype, t.shape, data.reshape(t.shape))
    return out


def same(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and np.array_equal(a[k].data, b[k].data) for k in a)


class CutOnce:
    """ASGI wrapper recording responses; cuts the next matching download after N bytes.

    It also records each request's method, path, status and body bytes received
    (``requests``), flips a byte of the body of the next ``corrupt[(method, suffix)]``
    matching requests, and answers 503 to matching requests once
    ``refuse_after[(method, suffix)]`` of them went through (a data layer going away).
    """

    def __init__(self, app) -> None:
        self.app = app
        self.cut: dict[str, int] = {}
        self.log: list[tuple[str, int, int]] = []  # (path, status, body bytes sent)
        self.requests: list[tuple[str, str, int, int]] = []  # (method, path, status, received)
        self.corrupt: dict[tuple[str, str], int] = {}
        self.refuse_after: dict[tuple[str, str], int] = {}

    def _matching(self, table: dict[tuple[str, str], int], method: str, path: str):
        return next((k for k in table if k[0] == method and path.endswith(k[1])), None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, status, sent, received = scope["path"], 0, 0, 0
        method = scope["method"]
        limit = next((self.cut.pop(k) for k in list(self.cut) if path.endswith(k)), None)
        refuse = self._matching(self.refuse_after, method, path)
        if refuse is not None:
            if self.refuse_after[refuse] <= 0:
                self.requests.append((method, path, 503, 0))
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return None
            self.refuse_after[refuse] -= 1
        damage = self._matching(self.corrupt, method, path)
        if damage is not None:
            self.corrupt[damage] -= 1
            if self.corrupt[damage] <= 0:
                del self.corrupt[damage]

        async def counting_receive():
            nonlocal received, damage
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                received += len(body)
                if damage is not None and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                    message = {**message, "body": body}
                    damage = None
            return message

        async def counting_send(message):
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if limit is not None and sent + len(body) > limit:
                    await send({**message, "body": body[: limit - sent], "more_body": True})
                    sent = limit
                    raise ConnectionAbortedError("connection cut by the test")
                sent += len(body)
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            self.log.append((path, status, sent))
            self.requests.append((method, path, status, received))

    def received(self, method: str, suffix: str) -> int:
        """Body bytes the server received in ``method`` requests to paths ending so."""
        return sum(n for m, p, _, n in self.requests if m == method and p.endswith(suffix))


@dataclass
class Server:
    url: str
    store: WeightStore
    wrapper: CutOnce
    published: list[tuple[str, int]] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(store: WeightStore, port: int | None = None, *, max_body_bytes: int | None = None,
            max_upload_bytes: int = 1 << 20) -> Iterator[Server]:
    """The weight routes over ``store`` on a real uvicorn server on 127.0.0.1; with
    ``max_body_bytes``, behind the data layer's request size limit."""
    published: list[tuple[str, int]] = []
    app = FastAPI()
    app.include_router(weights_router(store, bearer_auth(TOKEN),
                                      on_publish=lambda p, v: published.append((p, v)),
                                      max_upload_bytes=max_upload_bytes,
                                      max_body_bytes=max_body_bytes))
    limited = app if max_body_bytes is None else BodySizeLimit(app, max_body_bytes)
    wrapper = CutOnce(limited)
    port = port or _free_port()
    uv = uvicorn.Server(uvicorn.Config(wrapper, host="127.0.0.1", port=port, log_level="error",
                                       lifespan="off"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(500):
        if uv.started:
            started.set()
            break
        started.wait(0.01)
    assert uv.started, "uvicorn did not start within 5 s"
    try:
        yield Server(f"http://127.0.0.1:{port}", store, wrapper, published)
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
