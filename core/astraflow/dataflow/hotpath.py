"""The calls every node makes per rollout, answered without the web framework.

A lease, a submission and a heartbeat are most of what a data layer serves: at 10,000
nodes each costs the process more in FastAPI's routing, dependency solving and
request/response objects than in the service's own work (bench/scale.py). This ASGI
middleware sits in front of the framework and answers exactly those routes -- the same
bearer check, body decoding, validation, service call, reply encoding and error
answers the framework's routes give -- and hands every other request on unchanged. The
routes stay declared in the app, so the OpenAPI schema and every other client see one
API; the size limit stays the outer middleware's.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from pydantic import BaseModel

from astraflow.dataflow.payloads import FULL_ERRNOS
from astraflow.dataflow.records import ServiceError
from astraflow.dataflow.service import DataflowService
from astraflow.dataflow.wire import (
    JSON,
    MSGPACK,
    LeaseIn,
    PayloadError,
    SubmitIn,
    decode_body,
    parse,
)
from astraflow.security import token_problem

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the node id a heartbeat's path may carry (the framework route's rule); any other
#: path is left to the framework, which refuses it as it always has
HEARTBEAT = re.compile(r"^/v1/nodes/([A-Za-z0-9_.:-]{1,128})/heartbeat$")
UNAUTHORISED = [(b"www-authenticate", b"Bearer")]


class HotRoutes:
    """ASGI middleware answering ``POST /v1/leases``, ``POST /v1/trajectories`` and
    ``POST /v1/nodes/{id}/heartbeat`` itself (see the module's docstring)."""

    def __init__(self, app: ASGIApp, service: DataflowService, token: str) -> None:
        self.app = app
        self.service = service
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        path = scope["path"]
        node_id = None
        model: type[BaseModel] | None = None
        if path == "/v1/leases":
            model = LeaseIn
        elif path == "/v1/trajectories":
            model = SubmitIn
        elif not (path.startswith("/v1/nodes/") and (m := HEARTBEAT.match(path))):
            return await self.app(scope, receive, send)
        else:
            node_id = m.group(1)
        await self._serve(scope, receive, send, model, node_id)

    async def _serve(self, scope: Scope, receive: Receive, send: Send,
                     model: type[BaseModel] | None, node_id: str | None) -> None:
        authorization = content_type = accept = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"accept":
                accept = value
        problem = token_problem(authorization, self.expected)
        if problem is not None:
            return await _send(send, 401, {"detail": problem}, False, UNAUTHORISED)
        body = await _body(receive)
        try:
            if model is None:  # a heartbeat: no body
                reply = self.service.heartbeat(str(node_id))
            else:
                data = decode_body(body, content_type.decode("latin-1")) if body else {}
                req = parse(model, data)
                reply = await (self.service.lease(req) if model is LeaseIn
                               else self.service.submit(req))
        except (ServiceError, PayloadError, sqlite3.Error, OSError) as exc:
            status, detail = refusal(exc, self.service.settings.store_path)
            return await _send(send, status, {"detail": detail}, False)
        await _send(send, 200, reply, MSGPACK.encode() in accept)


def refusal(exc: ServiceError | PayloadError | sqlite3.Error | OSError, store: Any
            ) -> tuple[int, str]:
    """The status and ``detail`` a refused request is answered with, on the fast path and
    by the framework's exception handlers alike. A full disk is a 507 (nothing was
    written; clients retry, and the run goes on once space returns); other store
    failures a 503."""
    if isinstance(exc, ServiceError | PayloadError):
        return exc.status, str(exc)
    if isinstance(exc, sqlite3.Error):
        full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
        what = f"store write failed: {exc}"
    else:
        full, what = exc.errno in FULL_ERRNOS, f"store I/O failed: {exc}"
    if full:
        return 507, (f"disk full: the data layer's store {store} has no space left; "
                     "nothing was written, retry once space returns")
    return 503, what


def encode(data: Any, packed: bool) -> tuple[bytes, str]:
    """A reply's body and media type: msgpack when asked for, else JSON."""
    if packed:
        return msgpack.packb(data), MSGPACK
    return json.dumps(data).encode(), JSON


async def _body(receive: Receive) -> bytes:
    """The whole request body (the outer size limit ends it early when too large)."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    while message.get("more_body", False):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def _send(send: Send, status: int, data: Any, packed: bool,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """A reply as the framework's routes give it."""
    body, media = encode(data, packed)
    headers = [(b"content-length", str(len(body)).encode()),
               (b"content-type", media.encode()), *(extra or ())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
