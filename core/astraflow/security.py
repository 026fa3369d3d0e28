"""Bearer-token authentication and request size limits for every HTTP endpoint."""

from __future__ import annotations

import hmac
import os
import secrets

TOKEN_ENV = "ASTRAFLOW_TOKEN"


def resolve_token(token: str | None = None) -> str:
    """The shared token: explicit, else ``$ASTRAFLOW_TOKEN``, else a fresh random one."""
    return token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)


def bearer_auth(token: str):
    """A FastAPI dependency that rejects requests without ``Authorization: Bearer <token>``."""
    # imported here: the clients (every component, the launcher) import this module for
    # TOKEN_ENV, and fastapi is 0.3 s of start-up they do not need
    from fastapi import Header, HTTPException

    expected = f"Bearer {token}".encode()

    def check(authorization: str | None = Header(default=None)) -> None:
        problem = token_problem(None if authorization is None else authorization.encode(),
                                expected)
        if problem is not None:
            raise HTTPException(401, problem, headers={"WWW-Authenticate": "Bearer"})

    return check


def token_problem(authorization: bytes | None, expected: bytes) -> str | None:
    """What is wrong with an ``Authorization`` header against ``Bearer <token>`` (as
    bytes), or None when it is right: the 401's detail."""
    if not authorization:
        return "missing Authorization header: send 'Bearer <token>'"
    if not hmac.compare_digest(authorization, expected):
        return "invalid bearer token"
    return None


class BodySizeLimit:
    """ASGI middleware: 413 for bodies over ``max_bytes`` (declared or streamed)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return await self._reject(send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            return await self.app(scope, limited_receive, send)
        except _TooLarge:
            return await self._reject(send)

    async def _reject(self, send) -> None:
        body = f'{{"detail": "request body exceeds {self.max_bytes} bytes"}}'.encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
