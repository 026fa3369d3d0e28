"""``POST /v1/messages``: Anthropic's Messages API on the node's gateway.

Agents written for the ``anthropic`` client train unchanged: ``Anthropic(base_url=
client.anthropic_base_url, api_key=client.api_key)`` (or ``ANTHROPIC_BASE_URL`` and
``ANTHROPIC_API_KEY``, which a command agent is given). A request is turned into the
chat call it stands for -- ``system`` as the system message, an assistant's ``text``
and ``tool_use`` blocks one assistant turn, each ``tool_result`` block a tool message --
so it is sampled, recorded and token-exact as a chat completion is. Replies, streams
and errors are in this API's own format (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from astraflow.gateway.tools import function_tool

#: the API's error type for an HTTP status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error"}
#: why a reply ended, in this API's words
STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


class MessagesError(ValueError):
    """A request this API's rules refuse: (message, param)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": message}}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise MessagesError(f"{where}.content must be a string or a list of content blocks",
                            "messages")
    return content


def _result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    texts = []
    for b in _blocks(content, where):
        if b.get("type") != "text":
            raise MessagesError(f"{where}: a tool_result's content takes text blocks "
                                f"only, not {b.get('type')!r}", "messages")
        texts.append(str(b.get("text", "")))
    return "".join(texts)


def _system_text(blocks: list[dict[str, Any]], where: str) -> str:
    """System text blocks joined (their ``cache_control`` marks are hints: the engines
    keep prefixes by themselves)."""
    for k, b in enumerate(blocks):
        if b.get("type") != "text" or not isinstance(b.get("text", ""), str):
            raise MessagesError(f"{where}.content[{k}]: system content takes text blocks",
                                "system" if where == "system" else "messages")
    return "".join(str(b.get("text", "")) for b in blocks)


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out, texts = [], []
    for k, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": _result_text(block, f"{where}.content[{k}]")})
        elif kind == "text":
            texts.append(str(block.get("text", "")))
        else:
            raise MessagesError(f"{where}.content[{k}] is of type {kind!r}: this endpoint "
                                "takes text and tool_result blocks from the user",
                                "messages")
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls = [], []
    for k, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}),
                                                                        dict):
                raise MessagesError(f"{where}.content[{k}]: a tool_use block needs a 'name' "
                                    "and an 'input' object", "messages")
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block["name"],
                                       "arguments": json.dumps(block.get("input", {}))}})
        elif kind not in ("thinking", "redacted_thinking"):
            raise MessagesError(f"{where}.content[{k}] is of type {kind!r}: this endpoint "
                                "takes text and tool_use blocks from the assistant",
                                "messages")
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request ``body`` stands for."""
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise MessagesError("max_tokens: Field required (an integer)", "max_tokens")
    if body.get("top_k") is not None:
        raise MessagesError("top_k: the engines behind this endpoint sample with temperature "
                            "and top_p only", "top_k")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesError("messages: a non-empty list of messages is required", "messages")
    chat_messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        chat_messages.append({"role": "system", "content": system if isinstance(system, str)
                              else _system_text(_blocks(system, "system"), "system")})
    for k, m in enumerate(messages):
        where = f"messages.{k}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise MessagesError(f"{where}.role must be 'user', 'assistant' or 'system'",
                                "messages")
        blocks = _blocks(m.get("content"), where)
        if m["role"] == "user":
            chat_messages += _user(blocks, where)
        elif m["role"] == "system":  # a harness's mid-conversation instructions (Claude
            # Code's reminders): a system turn where it stands, as the template renders one
            chat_messages.append({"role": "system", "content": _system_text(blocks, where)})
        else:
            chat_messages.append(_assistant(blocks, where))
    stops = body.get("stop_sequences")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages,
                            "tools": _tools(body.get("tools")),
                            "max_tokens": body["max_tokens"],
                            "tool_choice": "none" if _choice(body) == "none" else "auto"}
    if stops is not None:
        chat["stop"] = stops
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    return chat


def _choice(body: dict[str, Any]) -> str:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise MessagesError("tool_choice: an object with a 'type' (auto, any, tool, none)",
                            "tool_choice")
    return str(choice["type"])


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise MessagesError("tools: must be a list", "tools")
    out = []
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or \
                tool.get("type") not in (None, "custom"):
            raise MessagesError(f"tools.{k}: this endpoint takes client tools ({{'name': ..., "
                                "'input_schema': ...}), not server tools", "tools")
        out.append(function_tool(tool["name"], tool.get("description"),
                                 tool.get("input_schema")))
    return out or None


def content_blocks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat reply message as this API's content blocks."""
    out: list[dict[str, Any]] = []
    if reply.get("content"):
        out.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError:
            arguments = {}
        out.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                    "input": arguments if isinstance(arguments, dict) else {}})
    return out


def message(role: str, reply: dict[str, Any], finish: str, stopped_by: str | None,
            prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The Message object of one sampled reply."""
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": role, "content": content_blocks(reply),
            "stop_reason": "stop_sequence" if stopped_by else STOP_REASONS.get(finish,
                                                                               "end_turn"),
            "stop_sequence": stopped_by,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}}


def stream_events(msg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events the API streams a finished message as (``event:`` name, data)."""
    start = {**msg, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**msg["usage"], "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(msg["content"]):
        first: dict[str, Any]
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            first = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": first}),
                   ("content_block_delta", {"type": "content_block_delta", "index": index,
                                            "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": index})]
    events += [("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": msg["stop_reason"],
                                            "stop_sequence": msg["stop_sequence"]},
                                  "usage": {"output_tokens": msg["usage"]["output_tokens"]}}),
               ("message_stop", {"type": "message_stop"})]
    return events
