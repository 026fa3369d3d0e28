"""Shared test suites and fixtures for AstraFlow plugins.

A plugin's tests subclass the contract suite of what it provides, e.g.::

    from astraflow.testing.rollout import RolloutBackendContract

    class TestMyBackend(RolloutBackendContract):
        backend_name = "mine"

and run ``test_plugin_is_installed`` through :func:`assert_plugin_installed`.
The fixtures in :mod:`astraflow.testing.pytest_plugin` load automatically (``pytest11``).
"""

from __future__ import annotations

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


__all__ = ["assert_plugin_installed"]
