"""The live dashboard: ``GET /dashboard`` (the page, with everything it needs inline: no
asset from the internet), ``GET /v1/dashboard`` (what it draws) and
``POST /dashboard/login``.

The page is behind the run's token like every route: a login form trades the token for
an HttpOnly, SameSite=Strict session cookie (an HMAC of the token, not the token), and a
link carrying ``#token=...`` logs in at once -- a URL fragment never reaches a server or
its logs. The cookie opens the dashboard's two GET routes only; every other route still
needs the bearer token, so a page elsewhere cannot act on the run through the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from astraflow.dataflow.service import DataflowService
from astraflow.security import bearer_auth

SESSION_COOKIE = "astraflow_session"
#: the longest login body read (a token is a few dozen characters)
_LOGIN_BYTES = 4096


def session_value(token: str) -> str:
    return hmac.new(token.encode(), b"astraflow dashboard session", hashlib.sha256).hexdigest()


def _page(name: str) -> str:
    return (resources.files("astraflow.dataflow") / name).read_text()


def _given_token(body: bytes, kind: str) -> str | Response:
    """The token a login form or JSON body gives, or the refusal of a body that gives none."""
    if len(body) > _LOGIN_BYTES:
        return JSONResponse({"detail": "login body too large"}, status_code=413)
    if kind == "application/x-www-form-urlencoded":
        return parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0]
    if kind != "application/json":
        return JSONResponse({"detail": "content type must be a form or application/json"},
                            status_code=415)
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return JSONResponse({"detail": "body is not valid JSON"}, status_code=400)
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        return JSONResponse({"detail": 'expected {"token": "..."}'}, status_code=422)
    return str(data["token"])


def dashboard_router(service: DataflowService, token: str) -> APIRouter:
    r = APIRouter()
    check_bearer = bearer_auth(token)
    session = session_value(token)
    dashboard, login = _page("dashboard.html"), _page("login.html")

    def allowed(request: Request) -> bool:
        try:  # the API's own bearer check
            check_bearer(request.headers.get("authorization"))
            return True
        except HTTPException:
            pass
        cookie = request.cookies.get(SESSION_COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(), session.encode())

    def login_page(error: str = "", status: int = 200) -> HTMLResponse:
        text = login.replace("<!--error-->", f'<p class="err">{error}</p>' if error else "")
        return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})

    @r.get("/v1/dashboard")
    async def data(request: Request) -> Response:
        """What the dashboard draws: /v1/status with each policy's steps, staleness of
        trained samples and evaluations, and each node's versions and refreshes. The
        bearer token or the dashboard's session cookie."""
        if not allowed(request):
            return JSONResponse({"detail": "missing or invalid token: send 'Bearer <token>' "
                                           "or log in at /dashboard"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return JSONResponse(service.timeline.view(service.status()),
                            headers={"Cache-Control": "no-store"})

    @r.get("/dashboard", include_in_schema=False)
    async def page(request: Request) -> Response:
        if not allowed(request):
            return login_page()
        return HTMLResponse(dashboard, headers={"Cache-Control": "no-store"})

    @r.post("/dashboard/login", include_in_schema=False)
    async def log_in(request: Request) -> Response:
        given = _given_token(await request.body(),
                             request.headers.get("content-type", "").split(";")[0].strip())
        if isinstance(given, Response):
            return given
        if not hmac.compare_digest(given.encode(), token.encode()):
            return login_page("That is not the run's token.", status=401)
        reply = RedirectResponse("/dashboard", status_code=303)
        reply.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict", path="/")
        return reply

    return r
