"""The Ray side of ``launcher=ray``: the actor that owns one component's process on
the machine Ray placed it on, and :class:`RayProc`, its face to the launcher (a Popen's)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from astraflow.lifecycle import LAUNCHER_ENV, READY_ENV

#: how long a poll of an actor may take before the component is taken as still running
#: (and asked again at the next look)
_ANSWER_SECONDS = 0.2
#: in a component's command line: its working directory on the machine it was placed on
WORK = "{work}"
#: the most bytes one pull of a file copies from a component's machine
_CHUNK = 16 << 20


class Component:
    """Owns one component process on the machine Ray placed it on, in a working
    directory of that machine; the launcher copies the files the run directory
    needs (log, metrics, final weights) from it over Ray, so no machine needs the
    driver's file system."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], work: str,
                 config: str) -> None:
        import subprocess
        import threading

        self.stopping = False
        self.work = os.path.join(work, name)
        os.makedirs(self.work, exist_ok=True)
        with open(os.path.join(self.work, "config.yaml"), "w") as fh:
            fh.write(config)
        self.ready = os.path.join(self.work, f"{name}.ready")
        # the component ends with this actor (SIGTERM on its death, however it dies)
        env = {**os.environ, **env, LAUNCHER_ENV: str(os.getpid()), READY_ENV: self.ready}
        argv = [a.replace(WORK, self.work) for a in argv]
        from astraflow.launch.oom import MemoryWatch

        self.name = name
        #: the component's exit code, once the watch reaped it; why it died, when
        #: the kernel's OOM killer killed it (:class:`astraflow.launch.oom.Death`)
        self.code: int | None = None
        self.oom: Any = None
        #: its peak memory and the machine's count of OOM kills
        self.memory = MemoryWatch()
        with open(os.path.join(self.work, f"{name}.log"), "ab") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "astraflow", *argv],
                                         stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.work, start_new_session=True)
        self.memory.started(name)
        threading.Thread(target=self._sample, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _sample(self) -> None:
        """The component's memory and the count of OOM kills, twice a second."""
        while self.code is None:
            self.memory.tick()
            self.memory.sample(self.name, self.proc.pid)
            time.sleep(0.5)

    def _watch(self) -> None:
        from astraflow.launch.oom import reap_blocking

        code, peak = reap_blocking(self.proc)
        self.memory.exited(self.name, peak)
        if code != 0 and self.worked() and not self.stopping:
            self.oom = self.memory.death(self.name, code, self.memory.peaks[self.name])
        if code != 0 and self.worked() and not self.stopping and self.oom is None:
            os._exit(1)  # Ray restarts this actor, and so the component
        # else the launcher reads the exit (poll); killed by the OOM killer, the
        # component would die the same way restarted, and the launcher stops the run
        self.code = code

    def worked(self) -> bool:
        return os.path.exists(self.ready)

    def poll(self) -> tuple[int | None, int, bool, Any]:
        return self.code, self.proc.pid, self.worked(), self.oom

    def read(self, path: str, offset: int) -> tuple[bytes, int]:
        """Up to ``_CHUNK`` bytes of a file under the working directory from
        ``offset``, and the file's size (0 and b"" when it does not exist yet)."""
        full = os.path.join(self.work, path)
        try:
            with open(full, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(min(offset, size))
                return fh.read(_CHUNK), size
        except FileNotFoundError:
            return b"", 0

    def files(self, path: str) -> list[str]:
        """Every file under a directory of the working directory, relative to it."""
        top = os.path.join(self.work, path)
        return sorted(os.path.relpath(os.path.join(d, f), self.work)
                      for d, _, names in os.walk(top) for f in names)

    def remove_work(self) -> None:
        """After a run that ended well: its files (checkpoints, store, weights)."""
        import shutil

        shutil.rmtree(self.work, ignore_errors=True)
        with contextlib.suppress(OSError):  # the run's directory, once empty
            os.rmdir(os.path.dirname(self.work))

    def node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def terminate(self) -> None:
        self.stopping = True
        if self.code is None:
            self.proc.terminate()


def component_actor(ray: Any) -> Any:
    """:class:`Component` as a Ray actor class."""
    return ray.remote(Component)


class RayProc:
    """The face of a component's actor that the launcher supervises (as a Popen)."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self.ray, self.actor = ray, actor
        self.returncode: int | None = None
        self.pid: int | None = None  # None until the actor first answers: not placed yet
        self.restarted = 0  # times Ray restarted it, as seen by the launcher
        self.gone: str | None = None  # why the actor is dead for good
        #: why the component died, when the kernel's OOM killer killed it
        self.oom: Any = None
        self.worked = False  # the component got to work (its last start, as last seen)
        self.spawned = time.time()
        #: since when the actor has not answered (a poll pending or refused), else None
        self.silent_since: float | None = None
        self.asked: Any = None  # the poll under way: an actor Ray has not placed yet
        # cannot answer, and the launcher does not wait for it

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ray = self.ray
        if self.asked is None:
            self.asked = self.actor.poll.remote()
            if self.silent_since is None:
                self.silent_since = time.time()
        ready, _ = ray.wait([self.asked], timeout=_ANSWER_SECONDS)
        if not ready:
            return None
        answer, self.asked = self.asked, None
        try:
            code, pid, self.worked, self.oom = ray.get(answer)
        except ray.exceptions.ActorUnavailableError:
            return None  # being restarted
        except ray.exceptions.RayActorError as exc:
            self.gone = str(exc).strip().splitlines()[0] if str(exc).strip() else "died"
            self.returncode = -1
            return self.returncode
        self.silent_since = None
        if self.pid is not None and pid != self.pid:
            self.restarted += 1
        self.pid = pid
        self.returncode = None if code is None else int(code)
        return self.returncode

    def terminate(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.actor.terminate.remote()

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.time() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.time() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired("ray actor", timeout or 0)
            time.sleep(0.2)
        return int(self.returncode or 0)

    def kill(self) -> None:
        self.ray.kill(self.actor, no_restart=True)
        self.returncode = self.returncode if self.returncode is not None else -9
