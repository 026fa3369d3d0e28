"""Hostile input at the dashboard's routes (the page, its login, its data): a thousand
generated requests -- forms and JSON with wrong types, garbage bodies, wrong content
types, forged cookies and tokens -- get a 2xx, 3xx or 4xx, never a 5xx or a hang, and
only the run's token opens the dashboard."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from dataflow_helpers import TOKEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astraflow.dataflow.dashboard import SESSION_COOKIE, session_value

pytestmark = pytest.mark.timeout(300)

tokens = st.sampled_from(["", TOKEN, TOKEN + "x", TOKEN[:-1], "Bearer", "\u00e9"]) | st.text(
    max_size=40)
bodies = st.one_of(
    tokens.map(lambda t: ("application/x-www-form-urlencoded", f"token={t}".encode())),
    st.builds(lambda v: ("application/json", json.dumps(v).encode()),
              st.fixed_dictionaries({"token": tokens | st.integers() | st.none()})
              | st.lists(st.integers(), max_size=3) | st.text(max_size=10)),
    st.tuples(st.sampled_from(["application/json", "application/x-www-form-urlencoded",
                               "text/plain", "multipart/form-data", ""]),
              st.binary(max_size=200)))


@st.composite
def requests(draw) -> tuple[str, str, dict[str, str], bytes, dict[str, str]]:
    path = draw(st.sampled_from(["/dashboard", "/dashboard/login", "/v1/dashboard",
                                 "/dashboard/", "/dashboard/login/x"]))
    method = draw(st.sampled_from(["GET", "POST"] if path == "/dashboard/login"
                                  else ["GET", "GET", "POST", "PUT"]))
    ctype, body = draw(bodies)
    headers = {"Content-Type": ctype} if ctype else {}
    if draw(st.booleans()):
        headers["Authorization"] = draw(st.sampled_from(["Bearer ", "Basic x", "Bearer x"])
                                        | tokens.map(lambda t: f"Bearer {t}"))
    cookies = {}
    if draw(st.booleans()):
        cookies[SESSION_COOKIE] = draw(st.sampled_from([session_value("other-token"), "",
                                                        session_value(TOKEN)[:-1]])
                                       | st.text(alphabet="0123456789abcdef", max_size=64))
    return method, path, headers, body, cookies


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from astraflow.dataflow.server import BackgroundServer
    from astraflow.dataflow.settings import DataflowSettings

    with BackgroundServer(DataflowSettings(store=str(tmp_path_factory.mktemp("store"))),
                          TOKEN) as srv:
        yield srv


def test_a_thousand_hostile_dashboard_requests_never_5xx_and_only_the_token_opens_it(server):
    statuses: list[int] = []
    with httpx.Client(base_url=server.url, timeout=10, follow_redirects=False) as http:

        @settings(max_examples=1000, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(requests())
        def one(case) -> None:
            method, path, headers, body, cookies = case
            http.cookies.clear()
            # any text as UTF-8 bytes, less what no HTTP/1.1 client may send (control
            # characters, surrounding blanks)
            raw = {k: re.sub(r"[\x00-\x1f\x7f]", "", v).strip().encode()
                   for k, v in headers.items()}
            for name, value in cookies.items():
                http.cookies.set(name, value)
            resp = http.request(method, path, content=body, headers=raw)
            statuses.append(resp.status_code)
            assert resp.status_code < 500, (method, path, headers, body[:100], resp.text[:300])
            if path == "/v1/dashboard" and resp.status_code == 200:
                # the data only with the token or the session cookie the token makes
                assert (headers.get("Authorization") == f"Bearer {TOKEN}"
                        or cookies.get(SESSION_COOKIE) == session_value(TOKEN)), headers
            if resp.status_code == 303:  # a login that succeeded: it was given the token
                assert TOKEN.encode() in body and path == "/dashboard/login"

        one()
    assert len(statuses) >= 1000 and {401, 200} <= set(statuses)
