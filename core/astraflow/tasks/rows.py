"""What a dataset row becomes: JSON-safe values, the answer as text, dotted keys
resolved, and prompts checked (text or chat messages)."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import math
import uuid
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

_DROP = object()


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types, so a task survives JSON and msgpack unchanged.

    numpy scalars and arrays become Python numbers and lists; datetimes their ISO text;
    NaN and infinities ``None`` (strict JSON has no such numbers); bytes that are UTF-8
    become text, other bytes (images, serialized blobs) are dropped -- left out of a
    mapping, ``None`` in a list -- since shipping them with every lease costs more than
    a text task can use.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # the common case, fast
        return value
    if kind is dict:
        return {str(k): safe for k, v in value.items() if (safe := json_safe(v)) is not _DROP}
    if kind is list:
        return [None if (safe := json_safe(v)) is _DROP else safe for v in value]
    return _json_safe_other(value)


def _json_safe_other(value: Any) -> Any:
    """Subclasses, other containers and non-JSON scalars."""
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    for plain in (bool, int, str):  # subclasses (numpy's str_, ...) as the plain type
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return json_safe(dict(value))
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return _DROP
    if isinstance(value, list | tuple | set | frozenset):
        return json_safe(list(value))
    return _json_safe_object(value)


def _json_safe_object(value: Any) -> Any:
    """The less common scalar types: numpy, dates and times, decimals, uuids, paths."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID | PurePath):
        return str(value)
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        import numpy as np

        if isinstance(value, np.datetime64 | np.timedelta64):
            return str(value)
        if isinstance(value, np.bytes_ | np.void):
            # numpy's stubs declare the buffer protocol for Python >= 3.12 only
            return json_safe(bytes(value))  # type: ignore[arg-type]
        return json_safe(value.tolist())
    return str(value)


def answer_text(value: Any) -> str | None:
    """An answer as the reward compares it: text as is, anything else as its JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class RowError(ValueError):
    """What is wrong with one row (the caller adds where the row is)."""


def _keys(value: Mapping[str, Any]) -> str:
    return ", ".join(str(k) for k in value) or "none"


def resolve(row: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted ``key`` (``reward_model.ground_truth``, ``prompt.0.content``).

    A column whose own name contains dots is found first, so dotted names still work.
    """
    if key in row:
        return row[key]
    parts = key.split(".")
    if len(parts) == 1:
        raise RowError(f"no key '{key}' (row keys: {_keys(row)})")
    value: Any = row
    for depth, part in enumerate(parts):
        parent = ".".join(parts[:depth])
        if isinstance(value, Mapping):
            if part not in value:
                where = f"'{parent}' has no '{part}' (its keys" if parent else (
                    f"the row has no '{part}' (row keys")
                raise RowError(f"no key '{key}': {where}: {_keys(value)})")
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            if not -len(value) <= int(part) < len(value):
                raise RowError(f"no key '{key}': '{parent}' has {len(value)} items, no "
                               f"item {part}")
            value = value[int(part)]
        else:
            kind = "null" if value is None else type(value).__name__
            raise RowError(f"no key '{key}': '{parent}' is {kind}, not a mapping")
    return value


def check_prompt(prompt: Any, key: str) -> None:
    """A prompt is non-empty text or a non-empty list of chat messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RowError(f"the prompt '{key}' is empty")
        return
    if prompt is None or prompt == []:
        raise RowError(f"the prompt '{key}' is empty")
    if not isinstance(prompt, list):
        raise RowError(f"the prompt '{key}' must be text or a list of chat messages, "
                       f"not {type(prompt).__name__}")
    for number, message in enumerate(prompt, 1):
        if not isinstance(message, Mapping):
            raise RowError(f"the prompt '{key}': message {number} is "
                           f"{type(message).__name__}, not a mapping with role and content")
        for part in ("role", "content"):
            if part not in message:
                raise RowError(f"the prompt '{key}': message {number} has no '{part}' "
                               f"(message keys: {_keys(message)})")
        if not isinstance(message["role"], str) or not message["role"]:
            raise RowError(f"the prompt '{key}': message {number} has no role")
