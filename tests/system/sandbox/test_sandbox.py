"""The sandbox against programs that misbehave, each run for real in a child process.

Every test that runs a misbehaving program then checks the two things a node cares
about: nothing of the program is left running, and the next program runs fine.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import astraflow.sandbox
from astraflow.sandbox import Sandbox, SandboxConfig
from astraflow.testing import wait_until

MODES = ["namespace", "refuse"]


def namespaces_work() -> bool:
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    """The directory the sandbox's private run directories are made in, for this test."""
    path = tmp_path / "runs"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def sandbox(mode: str = "auto", **settings) -> Sandbox:
    if mode == "namespace" and not namespaces_work():
        pytest.skip("no user namespaces here (unshare -rn fails)")
    return Sandbox(SandboxConfig(network=mode, **settings))


def processes_of(runs: Path, group: int | None = None) -> list[int]:
    """Processes working in a run directory under ``runs``, or in process group ``group``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or a zombie
            continue
        pgrp = int(stat.rsplit(")", 1)[1].split()[2])
        if cwd.startswith(str(runs)) or pgrp == group:
            found.append(int(entry.name))
    return found


def assert_nothing_left(runs: Path, group: int | None = None) -> None:
    wait_until(lambda: not processes_of(runs, group), 5, "the run's processes to be gone")
    assert list(runs.iterdir()) == []  # the private directories are removed too


def assert_alive(box: Sandbox) -> None:
    result = box.run_sync("print(sum(range(10)))")
    assert (result.status, result.stdout) == ("ok", "45\n")


def test_a_program_gets_stdin_and_its_output_and_exit_code_are_kept(runs):
    box = sandbox()
    code = "import sys\nprint(input()[::-1])\nprint('oops', file=sys.stderr)\nsys.exit(3)"
    result = box.run_sync(code, stdin="olleh\n")
    assert (result.status, result.returncode) == ("error", 3)
    assert (result.stdout, result.stderr) == ("hello\n", "oops\n")
    assert not result.ok and box.run_sync("print('fine')").ok


def test_files_are_given_in_a_private_directory_removed_afterwards(runs):
    code = ("import os, helper\n"
            "print(helper.inc(int(open('data/n.txt').read())))\n"
            "print(os.getcwd() == os.environ['HOME'])\n"
            "print(os.getcwd())")
    result = sandbox().run_sync(code, files={"data/n.txt": "41", "helper.py":
                                             "def inc(x):\n    return x + 1\n"})
    answer, home_is_cwd, cwd = result.stdout.split()
    assert (result.status, answer, home_is_cwd) == ("ok", "42", "True")
    assert cwd.startswith(str(runs)) and not Path(cwd).exists()
    with pytest.raises(ValueError, match="relative path inside"):
        sandbox().run_sync("pass", files={"../escape.py": ""})


def test_the_program_sees_none_of_the_callers_environment(runs, monkeypatch):
    monkeypatch.setenv("ASTRAFLOW_TOKEN", "s3cret-token")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    result = sandbox().run_sync("import os, sys\nprint(dict(os.environ), sys.path)")
    assert result.ok
    assert "s3cret-token" not in result.stdout and "/nowhere" not in result.stdout


def test_the_child_imports_no_astraflow_module(runs):
    """The child runs by its file's path under ``python -I`` and imports the standard
    library only: the program starts with no astraflow module loaded, and the sandbox
    package's directory is not on its path."""
    code = ("import json, sys\n"
            "print(json.dumps([[m for m in sys.modules if m.partition('.')[0] == 'astraflow'],"
            " sys.path]))")
    result = sandbox().run_sync(code)
    assert result.ok, result.stderr
    modules, path = json.loads(result.stdout)
    assert modules == []
    assert str(Path(astraflow.sandbox.__file__).parent) not in path


@pytest.mark.parametrize("mode", MODES)
def test_a_hung_program_and_its_escaped_child_are_killed_at_the_timeout(runs, mode):
    box = sandbox(mode, timeout=1.0)
    escape = "pidns" in box.layers or "cgroup-pids" in box.layers  # else setsid escapes
    code = ("import os\n"
            f"if os.fork() == 0:\n    {'os.setsid()' if escape else 'pass'}\n"
            "    while True: pass\n"
            "while True: pass\n")
    started = time.monotonic()
    result = box.run_sync(code)
    assert result.status == "timeout" and result.returncode is not None
    assert time.monotonic() - started < 1.0 + 3
    assert_nothing_left(runs, result.pid)
    assert_alive(box)


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_fails_to_fork_and_leaves_nothing_behind(runs, mode):
    box = sandbox(mode, timeout=2.0, max_processes=16)
    if "cgroup-pids" not in box.layers and "rlimit-nproc" not in box.layers:
        pytest.skip("no process limit here: root without a pids cgroup")
    result = box.run_sync("import os\nwhile True:\n    os.fork()\n")
    assert not result.ok
    assert "BlockingIOError" in result.stderr  # fork was refused, not the machine filled
    assert_nothing_left(runs, result.pid)
    assert subprocess.run(["true"]).returncode == 0
    assert_alive(box)


def test_a_4gib_allocation_ends_as_memory(runs):
    box = sandbox(memory_mb=256)
    result = box.run_sync("x = bytearray(4 * 1024**3)\nprint('allocated')")
    assert (result.status, result.stdout) == ("memory", "")
    assert "MemoryError" in result.stderr
    assert_nothing_left(runs, result.pid)
    assert_alive(box)


@pytest.mark.parametrize("mode", MODES)
def test_a_program_cannot_connect_to_a_listener_on_localhost(runs, mode):
    box = sandbox(mode)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = ("import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "    print('connected')\n"
                "except OSError as exc:\n"
                "    print('refused', type(exc).__name__)\n")
        result = box.run_sync(code)
        assert result.ok and result.stdout.startswith("refused"), result.stdout
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection is waiting to be accepted
            listener.accept()
    assert box.network_mode == mode
    assert_alive(box)


@pytest.mark.parametrize("mode", MODES)
def test_writes_outside_its_directory_fail_and_inside_it_work(runs, tmp_path, mode):
    box = sandbox(mode)
    targets = [tmp_path / f"escaped-{i}.txt" for i in range(3)]
    code = (
        "import os, subprocess\n"
        "def attempt(name, write):\n"
        "    try:\n"
        "        write()\n"
        "        print(name, 'wrote')\n"
        "    except Exception as exc:\n"
        "        print(name, 'refused', type(exc).__name__)\n"
        f"attempt('open', lambda: open({str(targets[0])!r}, 'w').write('x'))\n"
        f"attempt('shell', lambda: subprocess.run(['sh', '-c', 'echo x > {targets[1]}'],"
        " check=True))\n"
        "def libc():\n"  # past any audit hook: only the kernel can refuse this
        "    import ctypes\n"
        f"    fd = ctypes.CDLL(None).open({str(targets[2]).encode()!r}, 0o101, 0o644)\n"
        "    assert fd >= 0\n"
        "attempt('libc', libc)\n"
        "attempt('inside', lambda: open('mine.txt', 'w').write('kept'))\n"
        "print(open('mine.txt').read())\n"
    )
    result = box.run_sync(code)
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines[:3]] == ["refused"] * 3
    assert lines[3:] == ["inside wrote", "kept"]
    assert [target.exists() for target in targets] == [False] * 3
    assert_alive(box)


@pytest.mark.parametrize("mode", MODES)
def test_a_program_cannot_signal_the_process_that_runs_it(runs, mode):
    code = ("import os\n"
            "try:\n"
            f"    os.kill({os.getpid()}, 0)\n"
            "    print('could signal')\n"
            "except OSError as exc:\n"
            "    print('refused', type(exc).__name__)\n")
    result = sandbox(mode).run_sync(code)
    assert result.ok and result.stdout.startswith("refused"), result.stdout


def test_endless_output_is_cut_at_the_limit_and_stopped(runs):
    box = sandbox(timeout=20.0, max_output_bytes=1000)
    started = time.monotonic()
    result = box.run_sync("while True:\n    print('x' * 100)\n")
    assert result.status == "output_limit"
    assert len(result.stdout) == 1000
    assert time.monotonic() - started < 10  # stopped at the limit, not at the timeout
    assert_nothing_left(runs, result.pid)
    assert_alive(box)


def test_large_output_on_both_pipes_does_not_deadlock(runs):
    box = sandbox(max_output_bytes=2_000_000)
    code = ("import sys\n"
            "for _ in range(300):\n"
            "    sys.stdout.write('o' * 1000)\n"
            "    sys.stderr.write('e' * 1000)\n")
    result = box.run_sync(code)
    assert result.ok
    assert (len(result.stdout), len(result.stderr)) == (300_000, 300_000)


def test_at_most_concurrency_programs_run_at_once(runs):
    box = sandbox(concurrency=2)
    # each program is busy for one second (its workload, not a wait): spans that overlap
    # show how many ran at once
    code = ("import time\nstart = time.time()\nwhile time.time() < start + 1.0:\n    pass\n"
            "print(start, time.time())")

    async def four():
        return await asyncio.gather(*(box.run(code) for _ in range(4)))

    results = asyncio.run(four())
    assert all(result.ok for result in results)
    spans = [tuple(map(float, result.stdout.split())) for result in results]
    at_once = max(sum(start <= s < end for start, end in spans) for s, _ in spans)
    assert at_once == 2


def test_a_cancelled_run_leaves_nothing_behind(runs):
    box = sandbox(timeout=30.0)

    async def cancelled():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(box.run("while True: pass"), 1.0)

    asyncio.run(cancelled())
    assert_nothing_left(runs)
    assert_alive(box)


def test_the_network_mode_and_layers_in_force_are_told(runs):
    box = sandbox()
    assert box.network_mode == ("namespace" if namespaces_work() else "refuse")
    assert {"rlimits", "nocaps", "audit"} <= set(box.layers)
    with pytest.raises(ValueError, match=r"sandbox\.network=vpn: choose auto, namespace or refuse"):
        Sandbox(SandboxConfig(network="vpn"))
    with pytest.raises(ValueError, match=r"sandbox\.timeout=0: must be > 0"):
        Sandbox(SandboxConfig(timeout=0))
