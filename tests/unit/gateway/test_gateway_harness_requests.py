"""What Claude Code and Codex CLI send (their first requests, as captured from the
pinned versions), turned into the chat call the engine samples: nothing they send is
refused, and what cannot be served is left out in a way the harness goes on from."""

from __future__ import annotations

import json

import pytest

from astraflow.gateway import messages, responses

#: Claude Code 2.1.328's first request, its long texts cut short
CLAUDE_CODE = {
    "model": "policy", "max_tokens": 128000, "stream": True,
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium"},
    "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
               {"type": "text", "text": "You are a Claude agent.",
                "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r"
                                      "</system-reminder>\n"}, {"type": "text", "text": "hi"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /w"}]},
    ],
    "tools": [{"name": "Bash", "description": "Run a command.",
               "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
              {"name": "Later", "description": "A deferred tool.", "defer_loading": True,
               "input_schema": {"type": "object", "properties": {}}}],
}

#: Codex CLI 0.169.0's first request (wire_api=responses), cut short
CODEX = {
    "model": "policy", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"}, "store": False,
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
    "client_metadata": {"turn_id": "t"},
    "input": [
        {"type": "message", "id": "m0", "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "id": "m1", "role": "user",
         "content": [{"type": "input_text", "text": "say hi"}]},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Run.", "strict": False,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
         "tools": [{"type": "function", "name": "close_agent", "description": "Close.",
                    "parameters": {"type": "object", "properties": {}}}]},
        {"type": "custom", "name": "apply_patch", "description": "Patch files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "web_search", "external_web_access": False},
    ],
}


def test_claude_codes_request_keeps_its_system_turn_in_place():
    chat = messages.to_chat(CLAUDE_CODE)
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "system"]
    assert chat["messages"][0]["content"].endswith("You are a Claude agent.")
    assert chat["messages"][2]["content"] == "# Environment\ncwd: /w"
    assert [t["function"]["name"] for t in chat["tools"]] == ["Bash", "Later"]
    assert chat["max_tokens"] == 128000  # the gateway's cap and the context lower it


def test_a_system_turn_of_other_blocks_is_refused_saying_which():
    body = {**CLAUDE_CODE, "messages": [{"role": "system", "content": [
        {"type": "image", "source": {}}]}]}
    with pytest.raises(messages.MessagesError, match=r"messages\.0\.content\[0\]"):
        messages.to_chat(body)
    with pytest.raises(messages.MessagesError, match="'user', 'assistant' or 'system'"):
        messages.to_chat({**CLAUDE_CODE, "messages": [{"role": "tool", "content": "x"}]})


def test_codexs_tools_are_offered_as_functions_and_hosted_ones_left_out():
    chat, _ = responses.to_chat(CODEX, None)
    assert [t["function"]["name"] for t in chat["tools"]] == [
        "exec_command", "close_agent", "apply_patch"]
    patch = chat["tools"][2]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    # Codex names no max_output_tokens: the reply may run to the cap, not 16 tokens
    assert chat["max_tokens"] == responses.UNNAMED_MAX_TOKENS


def test_a_custom_tool_call_goes_out_and_comes_back_as_its_freeform_input():
    reply = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "apply_patch", "arguments": json.dumps({"input": "*** P"})}}]}
    (item,) = responses.output_items(reply, {"apply_patch"})
    assert item["type"] == "custom_tool_call" and item["input"] == "*** P"
    events = [kind for kind, _ in responses.stream_events(responses.response(
        CODEX, "policy", reply, "tool_calls", 5, 3, "resp_1"))]
    assert "response.custom_tool_call_input.done" in events
    history = {**CODEX, "input": [*CODEX["input"], item,
                                  {"type": "custom_tool_call_output", "call_id": "call_1",
                                   "output": "Done!"},
                                  {"type": "reasoning", "summary": []}]}
    chat, _ = responses.to_chat(history, None)
    assistant, tool = chat["messages"][-2:]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"input": "*** P"}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "Done!"}


def test_an_unknown_tool_or_item_is_still_a_clear_error():
    with pytest.raises(responses.ResponsesError, match=r"tools\[0\]: this endpoint takes"):
        responses.to_chat({**CODEX, "tools": [{"type": "telepathy", "name": "x"}]}, None)
    with pytest.raises(responses.ResponsesError, match=r"input\[0\] is of type 'dream'"):
        responses.to_chat({**CODEX, "input": [{"type": "dream"}]}, None)
