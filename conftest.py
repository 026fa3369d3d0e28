"""Test tiers, given by directory: ``tests/<tier>/...`` and ``plugins/<name>/tests/<tier>/...``.

- ``unit``: no subprocess, no engine, no network server beyond an in-process one; each
  test under 5 s. ``make test-fast`` runs this tier, the inner loop of development.
- ``system``: components, engines, browsers, Ray, real runs of ``python -m astraflow``.
- ``learning``: runs that assert an accuracy gain.

Each test gets its tier as a marker (``pytest -m unit``). A unit test that starts a
subprocess or takes longer than :data:`UNIT_SECONDS` fails, saying so: the tier stays
fast without anyone watching it. ``make test`` runs every tier.

``make test`` runs three pytest-xdist workers (``-n 3 --dist loadfile``): a test file is
the unit of work a worker takes, so a file's module-scoped fixtures (an engine) start
once; the files that share a Ray cluster, or that install packages into the environment,
go to one worker together (:data:`GROUPS`, :func:`pytest_xdist_make_scheduler`). Two
workers, one a core, take the tests the CPU paces; the third takes those the clock paces
(:data:`PACED`), which leave most of a core idle.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

#: pytester checks these tiers themselves (tests/system/core/test_core_test_tiers.py)
pytest_plugins = ["pytester"]

ROOT = Path(__file__).parent
TIERS = ("unit", "system", "learning")
UNIT_SECONDS = 5.0
#: directories and files whose tests one worker runs, one after another, under one name:
#: the Ray cluster's tests (``ray stop`` ends every cluster on the machine). Tests that
#: install a package install it with ``pip --target`` into a directory of their own, so
#: none changes the environment the other worker is using
GROUPS = {
    "tests/system/cluster": "ray-cluster",
}
#: tests whose length the clock sets (an environment's latency, a shaped link, timeouts,
#: Ray's placement and health checks), not the CPU: each keeps about half a core busy, one
#: a core (chaos). With three workers or more the last takes these alone, beside two on
#: the rest (:func:`pytest_xdist_make_scheduler`); a directory or a file named here is one
#: unit, a test its own
PACED = (
    "tests/system/cluster",
    "tests/system/faults/test_faults_chaos.py",
    "tests/system/elastic/test_elastic_cross_region.py",
    "tests/system/multipolicy/test_multipolicy_sync.py",
    # 45 s of steady load, whatever the CPU; nodes whose rollouts take 0.8 s each
    "tests/system/dataflow/test_dataflow_soak.py",
    "tests/system/elastic/test_elastic_nodes.py",
    # a browser following a run; a data layer stalled, a publish retried, a data layer
    # gone under a node: seconds of waiting for a fraction of a CPU-second
    "tests/system/dashboard/test_dashboard_browser.py",
    "tests/system/dataflow/test_dataflow_stall.py",
    "tests/system/weights/test_weights_publish_retry.py",
    "tests/system/faults/test_faults_node_leave.py",
    "tests/system/e2e/test_e2e_agent.py::test_an_agent_that_hangs_fails_its_rollout_and_the_run_goes_on",
)
#: audit events that start another process
SPAWNS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
          "os.system", "os.exec", "pty.spawn")

# the shared helpers of the system and learning tests (launched_runs, ...)
sys.path.insert(0, str(ROOT / "tests" / "helpers"))


def tier_of(path: Path) -> str | None:
    """The tier a test file's directory gives it, or None outside the tiers."""
    import os
    if os.environ.get("TIER_PROBE"):
        return "unit"
    parts = path.resolve().relative_to(ROOT).parts
    for i, part in enumerate(parts[:-2]):
        if part == "tests" and parts[i + 1] in TIERS:
            return parts[i + 1]
    return None


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (see conftest.py)")


_BEGAN = time.monotonic()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """When each xdist worker ran out of work: the last one sets the suite's time, and
    whether it is a CPU lane or the clock-paced one says where to cut."""
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"worker {node.gateway.id} finished after "
                            f"{time.monotonic() - _BEGAN:.0f} s")


def group_of(path: Path) -> str:
    """The xdist group of a test file: its entry in :data:`GROUPS`, else the file."""
    resolved = path.resolve()
    if not resolved.is_relative_to(ROOT):  # a test pytester writes elsewhere
        return resolved.as_posix()
    relative = resolved.relative_to(ROOT).as_posix()
    for prefix, name in GROUPS.items():
        if relative == prefix or relative.startswith(prefix + "/"):
            return name
    return relative


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with the files of a group of :data:`GROUPS` as one unit.
    (xdist's ``loadgroup`` reads markers into node ids in a way pytest 9 no longer
    allows: every test of a group was sent anywhere.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # in collection order (see pytest_collection_modifyitems), not xdist's default of
    # the files with the most tests first: those are the unit tier's quick ones
    config.option.loadscopereorder = False

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for paced in PACED:
                if nodeid == paced or nodeid.startswith((paced + "::", paced + "/")):
                    return paced
            return group_of(ROOT / nodeid.split("::", 1)[0])

        def _assign_work_unit(self, node) -> None:
            """With three workers or more, the last takes the :data:`PACED` units and
            nothing else; the others take the rest first, then what is left of those."""
            lane = self.numnodes >= 3 and node.gateway.id == f"gw{self.numnodes - 1}"
            units = list(self.workqueue)
            mine = [u for u in units if (u in PACED) == lane]
            if not mine and not lane:
                mine = units
            if not mine:
                # a worker runs the last test it holds only once it knows what comes next
                # or that nothing does: told so now, not when the whole queue is empty
                node.shutdown()
                return
            self.workqueue.move_to_end(mine[0], last=False)
            super()._assign_work_unit(node)

    return FileGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(f"{item.path}: a test belongs under tests/<tier>/ "
                                    f"(tiers: {', '.join(TIERS)})")
        item.add_marker(getattr(pytest.mark, tier))
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike
        # the longest work first, the unit tier's quick files last, where they fill
        # the gaps as the workers finish
        order = {"learning": 0, "system": 1, "unit": 2}
        items.sort(key=lambda item: order[tier_of(item.path)])


class _UnitGuard:
    """Notes what the running unit test spawned (an audit hook sees every process start,
    however it is made: subprocess, asyncio, multiprocessing, os.fork)."""

    def __init__(self) -> None:
        self.watching = False
        self.spawned: list[str] = []
        sys.addaudithook(self.audit)

    def audit(self, event: str, args: tuple) -> None:
        if self.watching and event in SPAWNS:
            self.spawned.append(f"{event} {str(args)[:160]}")


_guard = _UnitGuard()
_WAITED = pytest.StashKey[float]()


def _waited_for_a_core() -> float:
    """Seconds this thread has spent runnable but waiting for a core (Linux schedstat),
    0 where the kernel does not say. Taken off a unit test's time: with the other xdist
    worker (or anything else) busy on the same cores, the wait is not the test's doing."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    before = _waited_for_a_core()
    yield
    item.stash[_WAITED] = _waited_for_a_core() - before



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _guard.watching = item.get_closest_marker("unit") is not None
    _guard.spawned.clear()
    yield
    _guard.watching = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    # a teardown also ends fixtures wider than the test (after the session's last test,
    # a Ray cluster a system test started): what they spawn is not the test's doing
    _guard.watching = False
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("unit") is None or report.failed:
        return
    problems = []
    if _guard.spawned:
        problems.append(f"it started a process ({_guard.spawned[0]})")
        _guard.spawned.clear()
    took = call.duration - item.stash.get(_WAITED, 0.0)
    if call.when == "call" and took > UNIT_SECONDS:
        problems.append(f"it took {took:.1f} s (a unit test takes at most "
                        f"{UNIT_SECONDS:g} s)")
    if problems:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is in the unit tier, but "
                           + " and ".join(problems)
                           + ": make it a unit test, or move it to a system directory")
