"""Pause and resume for a rollout engine that runs its generation in a loop of its own."""

from __future__ import annotations

import asyncio


class Pausable:
    """``pause`` closes ``_open`` and returns once the engine's loop sets ``_idle`` (the
    work under way is done); ``resume`` opens it again. The engine creates both events,
    waits on ``_open`` before it takes work and clears ``_idle`` while it works."""

    _open: asyncio.Event
    _idle: asyncio.Event

    async def pause(self) -> None:
        self._open.clear()
        await self._idle.wait()

    async def resume(self) -> None:
        self._open.set()
