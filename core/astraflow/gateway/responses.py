"""``POST /v1/responses``: OpenAI's Responses API on the node's gateway.

The OpenAI Agents SDK and newer ``openai`` code talk to this API by default. A request
is turned into the chat call it stands for -- ``instructions`` as the system message,
``input`` items as messages (an assistant's ``message`` and ``function_call`` items one
assistant turn, each ``function_call_output`` a tool message), ``tools`` as functions --
so it is sampled, recorded and token-exact exactly as a chat completion is: a
continuing call that sends the earlier output back reuses the recorded tokens.
``previous_response_id`` continues a response of the same rollout (the gateway keeps
each rollout's conversations until the rollout ends). Errors are in the API's own
format, which is the chat completions API's.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from astraflow.gateway.record import content_text
from astraflow.gateway.tools import function_tool

#: what an ``input`` item's content part may be (text only: the engines take text)
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
#: hosted tools the API runs itself: not offered to the model here (no search, files,
#: images or computer behind this endpoint), so a harness that lists them goes on
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "image_generation",
                "code_interpreter", "computer_use_preview", "computer", "mcp", "tool_search",
                "local_shell", "shell", "apply_patch")
#: a custom (freeform) tool is offered as a function of one string argument
CUSTOM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}},
                 "required": ["input"]}
#: a request's max_output_tokens when it names none (the gateway's cap and the context
#: length lower it)
UNNAMED_MAX_TOKENS = 1 << 20
#: input items a harness keeps in its history that hold nothing for the model
SKIPPED_ITEMS = ("reasoning", "web_search_call", "file_search_call", "image_generation_call",
                 "compaction", "item_reference")


class ResponsesError(ValueError):
    """A request this API's rules refuse: (message, param)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ResponsesError(f"{where}.content must be a string or a list of parts", "input")
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise ResponsesError(f"{where}.content[{k}] is of type {kind!r}: this endpoint "
                                 f"takes text parts ({', '.join(TEXT_PARTS)})", "input")
        if not isinstance(part.get("text", ""), str):
            raise ResponsesError(f"{where}.content[{k}].text must be a string", "input")
    return content_text(content)


def to_chat(body: dict[str, Any], previous: list[dict[str, Any]] | None
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat completions request ``body`` stands for, and its conversation without
    the instructions (what a later ``previous_response_id`` continues)."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not (items or previous):
        raise ResponsesError("'input' must be a string or a non-empty list of items", "input")
    convo = [dict(m) for m in previous or []]
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ResponsesError(f"input[{k}] must be an object", "input")
        _add_item(convo, item, f"input[{k}]")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ResponsesError("'instructions' must be a string", "instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + convo
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                            "tools": _tools(body.get("tools"))[0],
                            "tool_choice": "none" if body.get("tool_choice") == "none"
                            else "auto"}
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p")):
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    # none named: as long as the model writes (Codex names none), up to the context and
    # agent.max_tokens_cap, as OpenAI's API answers it
    chat.setdefault("max_tokens", UNNAMED_MAX_TOKENS)
    return chat, convo


def _add_item(convo: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise ResponsesError(f"{where}.role must be user, system, developer or assistant",
                                 "input")
        convo.append({"role": "system" if role == "developer" else role,
                      "content": _text(item.get("content"), where)})
    elif kind in ("function_call", "custom_tool_call"):
        name, arguments = item.get("name"), item.get("arguments", "{}")
        if kind == "custom_tool_call":  # its freeform input, as the function's argument
            if not isinstance(item.get("input", ""), str):
                raise ResponsesError(f"{where}: a custom_tool_call's 'input' is a string",
                                     "input")
            arguments = json.dumps({"input": item.get("input", "")})
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise ResponsesError(f"{where}: a function_call needs a 'name' and 'arguments' "
                                 "(a JSON string)", "input")
        call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                "function": {"name": name, "arguments": arguments}}
        last = convo[-1] if convo else None
        if last is not None and last["role"] == "assistant":  # the same turn's calls
            last.setdefault("tool_calls", []).append(call)
            if last.get("content") == "":
                last["content"] = None
        else:
            convo.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        convo.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                      "content": _text(output, where) if isinstance(output, list)
                      else str(output if output is not None else "")})
    elif kind not in SKIPPED_ITEMS:  # this endpoint's models write no reasoning items
        raise ResponsesError(f"{where} is of type {kind!r}: this endpoint takes message, "
                             "function_call, custom_tool_call and their output items",
                             "input")


def _tools(tools: Any, where: str = "tools") -> tuple[list[dict[str, Any]] | None, set[str]]:
    """The request's tools as chat functions, and the names of its custom tools:
    function tools as they are, a namespace's tools as its own, custom tools as a
    function of one string (``input``), hosted tools (:data:`HOSTED_TOOLS`) left out."""
    if tools is None:
        return None, set()
    if not isinstance(tools, list):
        raise ResponsesError(f"'{where}' must be a list", "tools")
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    for k, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in HOSTED_TOOLS:
            continue
        if not isinstance(tool, dict) or kind not in ("function", "custom", "namespace") \
                or not isinstance(tool.get("name"), str):
            raise ResponsesError(f"{where}[{k}]: this endpoint takes function, custom and "
                                 "namespace tools ({'type': 'function', 'name': ..., "
                                 f"'parameters': ...}}); hosted tools ({', '.join(HOSTED_TOOLS)})"
                                 " are left out", "tools")
        if kind == "namespace":
            inner, inner_custom = _tools(tool.get("tools") or [], f"{where}[{k}].tools")
            out += inner or []
            custom |= inner_custom
            continue
        if kind == "custom":
            custom.add(tool["name"])
        out.append(function_tool(tool["name"], tool.get("description"),
                                 CUSTOM_SCHEMA if kind == "custom" else tool.get("parameters")))
    return out or None, custom


def output_items(reply: dict[str, Any], custom: set[str] | frozenset[str] = frozenset()
                 ) -> list[dict[str, Any]]:
    """A chat reply message as the Responses API's output items (a call of one of the
    ``custom`` tools as a ``custom_tool_call`` with its freeform ``input``)."""
    out: list[dict[str, Any]] = []
    if reply.get("content"):
        out.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply["content"],
                                 "annotations": [], "logprobs": []}]})
    for call in reply.get("tool_calls") or []:
        if call["function"]["name"] in custom:
            out.append({"type": "custom_tool_call", "id": f"ctc_{uuid.uuid4().hex}",
                        "call_id": call["id"], "name": call["function"]["name"],
                        "input": _custom_input(call["function"]["arguments"]),
                        "status": "completed"})
            continue
        out.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}",
                    "call_id": call["id"], "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"], "status": "completed"})
    return out


def _custom_input(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return str(value.get("input", "")) if isinstance(value, dict) else arguments


def response(body: dict[str, Any], role: str, reply: dict[str, Any], finish: str,
             prompt_tokens: int, completion_tokens: int, response_id: str) -> dict[str, Any]:
    """The Response object of one sampled reply."""
    incomplete = finish == "length"
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed", "model": role,
        "output": output_items(reply, _tools(body.get("tools"))[1]),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None, "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {}, "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": True,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def stream_events(resp: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events the API streams a finished response as (``event:`` name, data)."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **data}))

    started = {**resp, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(resp["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            emit("response.content_part.added", **where, part={**part, "text": ""})
            emit("response.output_text.delta", **where, delta=part["text"], logprobs=[])
            emit("response.output_text.done", **where, text=part["text"], logprobs=[])
            emit("response.content_part.done", **where, part=part)
        elif item["type"] == "custom_tool_call":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "input": ""})
            where = {"item_id": item["id"], "output_index": index}
            emit("response.custom_tool_call_input.delta", **where, delta=item["input"])
            emit("response.custom_tool_call_input.done", **where, input=item["input"])
        else:
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            where = {"item_id": item["id"], "output_index": index}
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit("response.function_call_arguments.done", **where, name=item["name"],
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if resp["status"] == "incomplete" else "response.completed",
         response=resp)
    return events
