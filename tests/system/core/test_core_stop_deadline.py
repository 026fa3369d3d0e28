"""A stop that hangs still ends: the launcher names what was left and where it was stuck,
kills it and exits, instead of keeping a Ctrl-C waiting for ever."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

from astraflow.launch.stopping import process_state
from astraflow.testing import wait_until

SCRIPT = textwrap.dedent("""
    import subprocess, sys, threading
    from astraflow.launch.stopping import StopDeadline

    # a component that ignores SIGTERM and waits for nothing: only SIGKILL ends it
    component = subprocess.Popen(
        [sys.executable, "-c", "import signal; "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(component.pid, flush=True)
    with StopDeadline(lambda: {"trainer-policy": component.pid}, float(sys.argv[1]), 130):
        if sys.argv[2] == "stuck":  # the stop waits on what never comes
            threading.Event().wait()
    print("stopped in time", flush=True)
""")


def _launcher(deadline: float, stop: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(deadline), stop],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_stuck_stop_kills_what_is_left_and_says_where_it_was():
    launcher = _launcher(1.0, "stuck")
    pid = 0
    try:
        out, err = launcher.communicate(timeout=60)
        pid = int(out.splitlines()[0])
        assert launcher.returncode == 130
        assert "stopping took over 1 s" in err
        assert f"trainer-policy (pid {pid}, state S)" in err  # what was left, as it was
        assert 'in <module>' in err and "stopped in time" not in out  # the stuck stop
        # killed, not left to run on (a zombie until its new parent reaps it)
        wait_until(lambda: process_state(pid) in ("gone", "Z"), 30, "the component to die")
    finally:
        with contextlib.suppress(OSError):
            if pid:
                os.kill(pid, signal.SIGKILL)
        launcher.kill()


def test_a_stop_within_its_deadline_is_left_alone():
    launcher = _launcher(30.0, "quick")
    pid = 0
    try:
        out, err = launcher.communicate(timeout=60)
        pid = int(out.splitlines()[0])
        assert launcher.returncode == 0 and "stopped in time" in out, err
        assert "stopping took" not in err
        assert process_state(pid) not in ("gone", "Z")  # nothing was killed
    finally:
        with contextlib.suppress(OSError):
            if pid:
                os.kill(pid, signal.SIGKILL)
        launcher.kill()
