"""Tool calls in a model's text, as the OpenAI API returns them.

A model writes a tool call as text in its own format; the gateway parses it into the
response's ``tool_calls`` (the sampled tokens themselves are kept as they are).

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5,
  Qwen3, Hermes and most chat templates that take ``tools``);
- ``pythonic``: ``name(argument)`` at the end of the text, for a tool of the request
  that takes one argument (the built-in tiny model's format);
- ``none``: never parse.

``auto`` picks ``hermes`` when the chat template mentions ``<tool_call>``, else
``pythonic``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from astraflow.errors import ConfigError

PARSERS = ("auto", "hermes", "pythonic", "none")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PYTHONIC = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\(([^()]*)\)\s*$")


@dataclass
class Parsed:
    """The text a client sees as ``content`` and the calls it sees as ``tool_calls``."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)


def function_tool(name: str, description: Any, parameters: Any) -> dict[str, Any]:
    """A tool of another API (Responses, Messages) as chat completions' ``tools`` entry."""
    return {"type": "function", "function": {
        "name": name, "description": description or "",
        "parameters": parameters or {"type": "object", "properties": {}}}}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def resolve_parser(name: str, chat_template: str | None) -> str:
    if name not in PARSERS:
        raise ConfigError(f"workflow.tool_parser={name}: expected one of {', '.join(PARSERS)}")
    if name != "auto":
        return name
    return "hermes" if chat_template and "<tool_call>" in chat_template else "pythonic"


def _tool_names(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and fn.get("name"):
            out[str(fn["name"])] = fn
    return out


def parse_tool_calls(parser: str, text: str, tools: list[dict[str, Any]] | None) -> Parsed:
    """Split ``text`` into content and tool calls (none when the request had no tools)."""
    known = _tool_names(tools)
    if parser == "none" or not known:
        return Parsed(text)
    if parser == "hermes":
        calls = []
        for raw in _HERMES.findall(text):
            try:
                data = json.loads(raw)
            except ValueError:
                continue  # not a call the client could run: left in the content
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                args = data.get("arguments", {})
                calls.append(_call(data["name"], args))
        if not calls:
            return Parsed(text)
        content = _HERMES.sub("", text).strip()
        return Parsed(content, calls)
    match = _PYTHONIC.search(text)
    if match is None or match.group(1) not in known:
        return Parsed(text)
    name, argument = match.group(1), match.group(2)
    params = list((known[name].get("parameters") or {}).get("properties") or {})
    key = params[0] if params else "input"
    return Parsed(text[: match.start()], [_call(name, {key: argument})])


def _call(name: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def stop_after_call(parser: str, tokenizer: Any) -> list[int]:
    """Token ids that end a turn right after a tool call, when the format has them: a
    pythonic call ends at ``)``, and the model waits there for the result."""
    if parser != "pythonic":
        return []
    close = tokenizer.token_id(")")
    return [close] if close is not None else []
