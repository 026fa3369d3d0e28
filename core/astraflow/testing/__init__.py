"""Shared test suites and fixtures for AstraFlow plugins.

A plugin's tests subclass the contract suite of what it provides, e.g.::

    from astraflow.testing.rollout import RolloutBackendContract

    class TestMyBackend(RolloutBackendContract):
        backend_name = "mine"

and run ``test_plugin_is_installed`` through :func:`assert_plugin_installed`.
The fixtures in :mod:`astraflow.testing.pytest_plugin` load automatically (``pytest11``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from astraflow.plugins import get_registry

_GROUP_KIND = {
    "raas": ["rollout_backend"],
    "trainer": ["trainer_backend"],
    "data": ["task_selector", "trajectory_filter", "batch_sampler"],
    "workflow": ["workflow"],
    "task": ["task"],
}


def assert_plugin_installed(plugin: str, distribution: str, group: str, option: str) -> None:
    """The plugin is discovered through its entry point and provides ``group=option``."""
    registry = get_registry(refresh=True)
    assert plugin in registry.plugins, f"plugin {plugin!r} not discovered: {list(registry.plugins)}"
    info = registry.plugins[plugin]
    assert info.error is None, f"plugin {plugin!r} failed to load: {info.error}"
    assert info.distribution == distribution
    assert option in info.provides.get(group, []), f"{plugin} provides {info.provides}"
    assert any(option in registry.entries[k] for k in _GROUP_KIND[group])


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
               process: subprocess.Popen | None = None, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy, and return it.

    Fails naming ``what`` after ``timeout`` seconds, or at once when ``process`` (the
    thing expected to make the condition true) has exited meanwhile.
    """
    give_up = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            err = process.stderr.read()[-3000:] if process.stderr else ""
            raise AssertionError(f"process exited ({process.returncode}) while waiting for "
                                 f"{what}: {err}")
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


__all__ = ["assert_plugin_installed", "wait_until"]


def launch_run(cwd: Any, *overrides: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m astraflow OVERRIDES`` in ``cwd`` as a user runs it; fails the test with
    the end of its console output unless it succeeds."""
    import sys

    proc = subprocess.run([sys.executable, "-m", "astraflow", "launcher.progress=false",
                           *overrides], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_summary(run_dir: Any) -> dict[str, Any]:
    """Each policy's entry of a finished run's ``summary.json``."""
    import json
    from pathlib import Path

    return json.loads((Path(run_dir) / "summary.json").read_text())["policies"]
