"""The registry of ``astraflow`` subcommands: a module that defines some registers them
with :func:`command`, and :mod:`astraflow.cli` dispatches to them. Kept apart from the
CLI so that modules defining commands need not import it (nor it them at import time).
"""

from __future__ import annotations

from collections.abc import Callable

Command = Callable[[list[str]], int]

COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    """Register the decorated function as ``astraflow NAME``."""

    def deco(fn: Command) -> Command:
        COMMANDS[name] = fn
        return fn

    return deco
