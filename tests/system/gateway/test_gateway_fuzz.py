"""Hostile input at the gateway (a RaaS node's OpenAI-compatible endpoint) and at the
data layer's dashboard: a thousand generated requests each -- bodies mutated from valid
ones, wrong types, garbage, wrong keys -- get a 4xx or a 200, never a 5xx, never a hang,
and the endpoint still serves afterwards. A request that outlives its rollout's key is
refused."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astraflow.types import Task

pytestmark = pytest.mark.timeout(600)

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "1+1="}],
        "max_tokens": 2, "temperature": 1.0, "n": 1}
COMPLETION = {"model": "policy", "prompt": "1+1=", "max_tokens": 2, "temperature": 1.0}
RESPONSES = {"model": "policy", "input": "1+1=", "max_output_tokens": 2, "temperature": 1.0}
MESSAGES = {"model": "policy", "max_tokens": 2,
            "messages": [{"role": "user", "content": "1+1="}]}
VALID = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION,
         "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}
#: what the mutations write into a body: values of every JSON type, some huge
values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
    | st.sampled_from([1e308, -1, 0, 10**9, "", "policy", "verifier", "system", "tool"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)
#: the fields the endpoint reads, so mutations land where they matter
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "n", "stop", "seed", "stream", "logprobs", "top_logprobs", "tools",
          "tool_choice", "stream_options", "response_format", "echo", "suffix",
          # the Responses and Messages APIs'
          "input", "instructions", "max_output_tokens", "previous_response_id", "system",
          "stop_sequences", "top_k", "metadata"]
#: what an item or block of the Responses and Messages APIs may say it is
ITEM_TYPES = ["message", "function_call", "function_call_output", "reasoning", "text",
              "tool_use", "tool_result", "image", "input_text", "x"]


@st.composite
def requests(draw) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(VALID)))
    body: Any = json.loads(json.dumps(VALID[path]))
    kind = draw(st.sampled_from(["field", "field", "message", "drop", "garbage", "shape"]))
    if kind == "field":
        body[draw(st.sampled_from(FIELDS))] = draw(values)
    elif kind == "message" and path.endswith("chat/completions"):
        message = {"role": draw(st.sampled_from(["user", "assistant", "system", "tool", "x"])),
                   "content": draw(values)}
        if draw(st.booleans()):
            message[draw(st.sampled_from(["tool_calls", "name", "tool_call_id"]))] = \
                draw(values)
        body["messages"] = draw(st.lists(st.just(message), min_size=0, max_size=3))
    elif kind == "message":  # an item (Responses) or content blocks (Messages)
        item = {"type": draw(st.sampled_from(ITEM_TYPES)),
                "role": draw(st.sampled_from(["user", "assistant", "developer", "x"]))}
        for key in draw(st.lists(st.sampled_from(
                ["content", "text", "call_id", "name", "arguments", "output", "id",
                 "input", "tool_use_id"]), max_size=3)):
            item[key] = draw(values)
        if path.endswith("responses"):
            body["input"] = draw(st.lists(st.just(item), min_size=0, max_size=3))
        elif path.endswith("messages"):
            body["messages"] = [{"role": item["role"], "content": [item]}]
    elif kind == "drop":
        del body[draw(st.sampled_from(sorted(body)))]
    elif kind == "garbage":
        return path, draw(st.binary(max_size=64))
    else:
        body = draw(values)
    return path, json.dumps(body).encode()


def test_a_thousand_hostile_requests_get_4xx_or_an_answer_never_5xx(node):
    session = node.open(Task("fuzz", "1+1=", "2"), ["policy"])
    auth = {"Authorization": f"Bearer {session.key}", "Content-Type": "application/json"}
    statuses: list[int] = []
    with httpx.Client(base_url=node.gateway.url, timeout=30) as http:

        @settings(max_examples=1000, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(requests())
        def one(case: tuple[str, bytes]) -> None:
            path, body = case
            resp = http.post(path, content=body, headers=auth)  # a hang: a timeout error
            statuses.append(resp.status_code)
            assert resp.status_code < 500, (path, body[:300], resp.text[:500])
            if resp.status_code >= 400:
                assert resp.json()["error"]["message"]

        one()
        assert len(statuses) >= 1000
        assert any(s == 200 for s in statuses) and any(400 <= s < 500 for s in statuses)
        ok = http.post("/v1/completions", json=COMPLETION, headers=auth)
        assert ok.status_code == 200 and ok.json()["choices"]
        # the rollout ends: a request still carrying its key is refused
        node.gateway.close(session.key)
        late = http.post("/v1/completions", json=COMPLETION, headers=auth)
        assert late.status_code == 401 and "rollout has ended" in late.json()["error"]["message"]
