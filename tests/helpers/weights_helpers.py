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

from astraflow.security import bearer_auth
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
    """ASGI wrapper recording responses; cuts the next matching download after N bytes."""

    def __init__(self, app) -> None:
        self.app = app
        self.cut: dict[str, int] = {}
        self.log: list[tuple[str, int, int]] = []  # (path, status, body bytes sent)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, status, sent = scope["path"], 0, 0
        limit = next((self.cut.pop(k) for k in list(self.cut) if path.endswith(k)), None)

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
            await self.app(scope, receive, counting_send)
        finally:
            self.log.append((path, status, sent))


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
def serving(store: WeightStore, port: int | None = None) -> Iterator[Server]:
    """The weight routes over ``store`` on a real uvicorn server on 127.0.0.1."""
    published: list[tuple[str, int]] = []
    app = FastAPI()
    app.include_router(weights_router(store, bearer_auth(TOKEN),
                                      on_publish=lambda p, v: published.append((p, v)),
                                      max_upload_bytes=1 << 20))
    wrapper = CutOnce(app)
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
