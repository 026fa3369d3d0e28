"""A real Ray cluster of two Ray nodes on this machine.

The head has the custom resource ``pool_a``, the second node (its own temp dir)
``pool_b``, so a rollout pool pinned by resource runs on one Ray node or the other.
"""

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from astraflow.testing.runs import descendants, pids_of

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: the head's job server (``ray job submit --address``), once the cluster is up
JOB_SERVER: dict[str, str] = {}


def _ray(*args: str) -> None:
    # a submitted job's `python` is the one on the cluster's PATH: this environment's
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": path}
    proc = subprocess.run([RAY, *args], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


#: the running cluster: its address and what stopping it needs
_RUNNING: dict[str, object] = {}


def _start() -> str:
    # short temp dirs: Ray's unix sockets live there, and their paths are length-limited
    head_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")
    worker_dir = tempfile.mkdtemp(prefix="rayw", dir="/tmp")
    port, dashboard = _free_port(), _free_port()
    # the cluster's own token (Ray's token authentication, as a real cluster runs it),
    # given to every process of the session: not whatever ~/.ray holds on this machine
    token = Path(head_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    _RUNNING.update(dirs=(head_dir, worker_dir), saved=saved)
    _ray("start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--num-cpus=3", '--resources={"pool_a": 2}', f"--temp-dir={head_dir}",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", "--disable-usage-stats")
    JOB_SERVER["url"] = f"http://127.0.0.1:{dashboard}"
    _RUNNING["address"] = f"127.0.0.1:{port}"
    start_second_node()
    return _RUNNING["address"]


def start_second_node() -> None:
    """The cluster's second Ray node (``pool_b``), joining the head."""
    _RUNNING["second_stopped"] = False
    _ray("start", f"--address={_RUNNING['address']}", "--node-ip-address=127.0.0.1",
         "--num-cpus=2", '--resources={"pool_b": 2}', f"--temp-dir={_RUNNING['dirs'][1]}",
         "--disable-usage-stats")


def stop_second_node() -> int:
    """What ``ray stop`` does on the second machine: every Ray process of that node (its
    raylet, what the raylet started -- the actors' workers -- and its other daemons)
    killed at once. The number of processes killed."""
    mine = pids_of(str(_RUNNING["dirs"][1]))
    victims = set(mine)
    for pid in mine:
        victims.update(descendants(pid))
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _RUNNING["second_stopped"] = True
    return len(victims)


def _stop() -> None:
    if not _RUNNING:
        return
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
    for key, value in _RUNNING["saved"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for folder in _RUNNING["dirs"]:
        shutil.rmtree(folder, ignore_errors=True)
    _RUNNING.clear()
    JOB_SERVER.clear()


@pytest.fixture
def cluster():
    """The cluster's address. It starts for the first test of this directory that asks
    for it and stops after the directory's last test, not at the session's end: its
    twenty-odd processes would take a share of the two cores from every later test."""
    if "address" in _RUNNING:
        return _RUNNING["address"]
    try:
        return _start()
    except BaseException:
        _stop()
        raise


def pytest_runtest_teardown(item, nextitem):
    # a conftest's test hooks see only the tests under its directory
    here = Path(__file__).parent
    if nextitem is None or here not in Path(nextitem.path).parents:
        _stop()


def pytest_sessionfinish(session):
    _stop()


@pytest.fixture
def second_node(cluster):
    """Stops (``stop()``, as ``ray stop`` on that machine) and starts (``start()``) the
    cluster's second Ray node; the next test finds it running again."""
    yield SimpleNamespace(stop=stop_second_node, start=start_second_node)
    if _RUNNING.get("second_stopped"):
        start_second_node()


@pytest.fixture
def job_server(cluster):
    return JOB_SERVER["url"]
