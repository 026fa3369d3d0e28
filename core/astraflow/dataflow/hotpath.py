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

import hmac
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

    def __init__(self, app: ASGIApp, service: DataflowService, token: str,
                 disk_full: Callable[[], str]) -> None:
        self.app = app
        self.service = service
        self.expected = f"Bearer {token}".encode()
        self.disk_full = disk_full

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path == "/v1/leases":
            handler: Callable[[Any], Awaitable[Any]] = self.service.lease
            model: type[BaseModel] | None = LeaseIn
        elif path == "/v1/trajectories":
            handler, model = self.service.submit, SubmitIn
        elif path.startswith("/v1/nodes/") and (m := HEARTBEAT.match(path)):
            node_id = m.group(1)
            handler, model = self._heartbeat(node_id), None
        else:
            return await self.app(scope, receive, send)
        await self._serve(scope, receive, send, handler, model)

    def _heartbeat(self, node_id: str) -> Callable[[Any], Awaitable[Any]]:
        async def beat(_req: Any) -> Any:
            return self.service.heartbeat(node_id)
        return beat

    async def _serve(self, scope: Scope, receive: Receive, send: Send,
                     handler: Callable[[Any], Awaitable[Any]],
                     model: type[BaseModel] | None) -> None:
        authorization = content_type = accept = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"accept":
                accept = value
        packed = MSGPACK.encode() in accept
        if not authorization:
            return await _send(send, 401, {"detail": "missing Authorization header: send "
                                                     "'Bearer <token>'"}, False, UNAUTHORISED)
        if not hmac.compare_digest(authorization, self.expected):
            return await _send(send, 401, {"detail": "invalid bearer token"}, False,
                               UNAUTHORISED)
        body = await _body(receive)
        try:
            req = None
            if model is not None:
                data = decode_body(body, content_type.decode("latin-1")) if body else {}
                req = parse(model, data)
            reply = await handler(req)
        except (ServiceError, PayloadError) as exc:
            return await _send(send, exc.status, {"detail": str(exc)}, False)
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                return await _send(send, 507, {"detail": self.disk_full()}, False)
            return await _send(send, 503, {"detail": f"store write failed: {exc}"}, False)
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                return await _send(send, 507, {"detail": self.disk_full()}, False)
            return await _send(send, 503, {"detail": f"store I/O failed: {exc}"}, False)
        await _send(send, 200, reply, packed)


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
    """A reply as the framework's routes give it: msgpack when asked for, else JSON."""
    if packed:
        body, media = msgpack.packb(data), MSGPACK
    else:
        body, media = json.dumps(data).encode(), JSON
    headers = [(b"content-length", str(len(body)).encode()),
               (b"content-type", media.encode()), *(extra or ())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
