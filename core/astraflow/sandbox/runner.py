""":class:`Sandbox`: runs programs confined, ``concurrency`` at a time, in the network
mode it chose when built.

asyncio is imported only inside the functions that use it.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from astraflow.sandbox.cgroups import pids_cgroup_parent
from astraflow.sandbox.config import SandboxConfig
from astraflow.sandbox.network import choose_network, layers_in_force
from astraflow.sandbox.process import execute, run_in_new_loop
from astraflow.sandbox.result import SandboxResult
from astraflow.schema import check_instance

if TYPE_CHECKING:
    import asyncio


class Sandbox:
    """Runs programs, ``concurrency`` at a time: :meth:`run` calls share one limit per
    event loop, :meth:`run_sync` calls (from any threads) share another.

    The network mode is decided once, here, by running a probe program: a sandbox that
    cannot confine anything fails now, in one line, not on every sample later.
    :attr:`network_mode` is the mode chosen, :attr:`layers` names the layers in force
    (:mod:`astraflow.sandbox` describes each).
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        # a sandbox is also built in code, not only from a checked run config: the limits
        # its settings declare are checked here too
        if wrong := check_instance(self.config, "sandbox."):
            raise ValueError("; ".join(wrong))
        self._cgroup_parent = pids_cgroup_parent()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._slots = weakref.WeakKeyDictionary()
        self._sync_slots = threading.BoundedSemaphore(self.config.concurrency)
        self.network_mode = choose_network(self.config, self._cgroup_parent)
        self.layers: tuple[str, ...] = layers_in_force(
            self.config, self.network_mode, self._cgroup_parent
        )

    async def run(
        self,
        code: str,
        stdin: str = "",
        files: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> SandboxResult:
        """Run ``code`` with ``stdin`` in a fresh directory holding ``files`` (relative
        path: text). Never raises for what the program does."""
        import asyncio

        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.config.concurrency))
        async with slots:
            return await self._execute(code, stdin, files, timeout)

    def run_sync(
        self,
        code: str,
        stdin: str = "",
        files: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> SandboxResult:
        """:meth:`run` for callers without an event loop (blocks the calling thread)."""
        with self._sync_slots:
            return run_in_new_loop(self._execute(code, stdin, files, timeout))

    async def _execute(
        self, code: str, stdin: str, files: dict[str, str] | None, timeout: float | None
    ) -> SandboxResult:
        return await execute(
            self.config, code, stdin, files, timeout, self.network_mode, self._cgroup_parent
        )
