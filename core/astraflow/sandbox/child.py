"""The sandboxed child: the confinement of one run, and the program it then runs.

:mod:`astraflow.sandbox.process` starts it as a script, ``python -I child.py SETTINGS``
(``SETTINGS`` is a JSON object: the run's directories, program, network mode, cgroup
and limits). It confines itself -- namespaces, a pids cgroup, rlimits, Landlock, no
capabilities, an audit hook; :mod:`astraflow.sandbox` describes each layer -- and runs
the program as ``__main__``.

Isolated mode leaves this file's directory off ``sys.path``: the file is no part of a
package when it runs, and imports the standard library only, never the ``astraflow``
package (a run starts a third faster than one importing the parent's asyncio). The
parent imports the exit codes and ``LAYERS_ENV`` from here.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

#: the child tells which layers it put in force (read by the probe of
#: :mod:`astraflow.sandbox.network`)
LAYERS_ENV = "ASTRAFLOW_SANDBOX_LAYERS"
#: exit code of the child: the program ran out of memory
MEMORY_EXIT = 86
#: exit code of the child: it could not confine itself, so the program did not run
SETUP_FAILED = 125

# unshare(2) flags
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

# prctl(2) options
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

# Landlock system call numbers (the same on every architecture)
_LANDLOCK_CREATE_RULESET = 444
_LANDLOCK_ADD_RULE = 445
_LANDLOCK_RESTRICT_SELF = 446

#: Landlock filesystem rights that change the filesystem, by the ABI that added them
_LANDLOCK_WRITES = {
    # write a file; remove a directory or file; make a char device, directory, regular
    # file, socket, fifo, block device or symlink
    1: 0b1_1111_1111_0010,
    2: 1 << 13,  # refer (link or rename across directories)
    3: 1 << 14,  # truncate
}

#: open() flags that write
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

#: audit events that change the filesystem: (indices of their paths, of their dir_fds)
_PATH_EVENTS = {
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.link": ((0, 1), (2, 3)),
    "os.symlink": ((1,), (2,)),
    "os.truncate": ((0,), ()),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.utime": ((0,), (3,)),
    "os.mkfifo": ((0,), (2,)),
    "os.mknod": ((0,), (3,)),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
}

#: audit events that look a name or an address up
_LOOKUP_EVENTS = {
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
}

#: audit events whose second argument is a socket address
_ADDRESS_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}

#: audit events that start another program or load native code
_SPAWN_EVENTS = {
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.system",
    "subprocess.Popen",
    "ctypes.dlopen",
    "pty.spawn",
}


def main(settings: dict[str, Any]) -> None:
    """Confines this process (and, with namespaces, a forked first process of a fresh
    PID namespace), then runs the program. A step that fails ends the run unstarted."""
    step = "start"
    try:
        layers = []
        if settings["cgroup"]:
            step = "join the pids cgroup"
            Path(settings["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
            layers.append("cgroup-pids")
        if settings["network"] == "namespace":
            step = "enter user, network and PID namespaces"
            _enter_namespaces()
            layers += ["netns", "pidns"]
            child = os.fork()
            if child:
                _relay(child)
            _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        step = "set resource limits"
        layers += _set_limits(settings)
        step = "restrict itself with Landlock"
        layers += _landlock([settings["work"], settings["tmp"]])
        step = "drop its capabilities"
        _drop_capabilities()
        layers.append("nocaps")
    except OSError as exc:
        print(f"astraflow sandbox: could not {step}: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)

    os.environ[LAYERS_ENV] = ",".join([*layers, "audit"])
    writable = (os.path.realpath(settings["work"]), os.path.realpath(settings["tmp"]))
    sys.addaudithook(
        _audit_hook(
            writable,
            refuse_network=settings["network"] != "namespace",
            refuse_spawn="landlock-fs" not in layers,
            refuse_signals="pidns" not in layers and "landlock-scope" not in layers,
        )
    )
    _run_program(settings["program"], settings["work"])


def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    """``result`` of a libc call, or an OSError naming ``what`` when it failed."""
    if result < 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _enter_namespaces() -> None:
    """New user, network and PID namespaces, this process's user and group mapped to
    themselves. The PID namespace takes effect for the next process forked."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID), "unshare")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _relay(child: int) -> None:
    """Waits for the namespace's first process and ends as it ended; killing this
    process kills it (PR_SET_PDEATHSIG), and with it the whole PID namespace."""
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number != signal.SIGKILL:
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _set_limits(settings: dict[str, Any]) -> list[str]:
    """Address space, CPU seconds, file size, no core dumps and processes (which the
    kernel enforces for a non-root user only); never above a hard limit already set."""
    import resource

    def limit(kind: int, soft: int, hard: int | None = None) -> None:
        _, current = resource.getrlimit(kind)
        hard = soft if hard is None else hard
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(kind, (soft, hard))

    limit(resource.RLIMIT_AS, settings["memory_bytes"])
    limit(resource.RLIMIT_CPU, settings["cpu_seconds"], settings["cpu_seconds"] + 1)
    limit(resource.RLIMIT_FSIZE, settings["max_file_bytes"])
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_NPROC, settings["max_processes"])
    if os.geteuid() == 0:
        return ["rlimits"]
    return ["rlimits", "rlimit-nproc"]


def _landlock(writable: list[str]) -> list[str]:
    """Writes only under ``writable`` (and to /dev/null), no TCP, no signals or abstract
    sockets out of the sandbox -- as far as this kernel's Landlock ABI goes."""
    import ctypes

    class RulesetAttr(ctypes.Structure):
        _fields_ = [
            ("fs", ctypes.c_uint64),
            ("net", ctypes.c_uint64),
            ("scoped", ctypes.c_uint64),
        ]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    libc = _libc()
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return []  # no Landlock in this kernel: the audit hook refuses more instead

    writes = sum(bits for version, bits in _LANDLOCK_WRITES.items() if abi >= version)
    tcp = 0b11 if abi >= 4 else 0  # bind, connect
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets, signals
    attr = RulesetAttr(writes, tcp, scoped)
    ruleset = _check(
        libc.syscall(
            _LANDLOCK_CREATE_RULESET,
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
            ctypes.c_uint32(0),
        ),
        "landlock_create_ruleset",
    )

    rules = [(path, writes) for path in writable]
    rules.append(("/dev/null", 0b10 | (1 << 14 if abi >= 3 else 0)))  # write, truncate
    for path, allowed in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            rule = PathBeneath(allowed, fd)
            _check(
                libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0),
                f"landlock_add_rule {path}",
            )
        finally:
            os.close(fd)

    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)

    layers = ["landlock-fs"]
    if abi >= 4:
        layers.append("landlock-tcp")
    if abi >= 6:
        layers.append("landlock-scope")
    return layers


def _drop_capabilities() -> None:
    """Empty capability sets; with no_new_privs no exec gives them back, not even root's."""
    import ctypes

    libc = _libc()
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # _LINUX_CAPABILITY_VERSION_3, and pid 0: this process
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    _check(libc.capset(header, data), "capset")


def _audit_hook(
    writable: tuple[str, ...],
    refuse_network: bool,
    refuse_spawn: bool,
    refuse_signals: bool,
) -> Any:
    """Refusals inside the interpreter: an early, readable PermissionError where the
    kernel layers would fail later, and the only guard where they are missing."""
    import socket

    def inside(path: Any) -> bool:
        if isinstance(path, int):  # an open file descriptor
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real == "/dev/null" or any(
            real == d or real.startswith(d + os.sep) for d in writable
        )

    def refuse(what: str) -> None:
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            if args[2] & _WRITE_FLAGS and not inside(args[0]):
                refuse(f"writing {args[0]!r} outside the program's directory")

        elif event in _PATH_EVENTS:
            paths, dir_fds = _PATH_EVENTS[event]
            if any(args[i] not in (None, -1) for i in dir_fds):
                refuse(f"{event} relative to a directory descriptor")
            for i in paths:
                if not inside(args[i]):
                    refuse(f"{event} on {args[i]!r} outside the program's directory")

        elif event == "socket.__new__":
            if refuse_network and args[1] != socket.AF_UNIX:
                refuse("network access")

        elif event in _ADDRESS_EVENTS:
            address = args[1]
            if isinstance(address, str | bytes):  # a unix socket's path
                if not address or address[:1] in ("\0", b"\0") or not inside(address):
                    refuse(f"a socket at {address!r}")
            elif refuse_network:
                refuse("network access")

        elif event in _LOOKUP_EVENTS and refuse_network:
            refuse("name lookup")

        elif event in _SPAWN_EVENTS and refuse_spawn:
            refuse(f"{event} without Landlock to confine it")

        elif event in ("os.kill", "os.killpg") and refuse_signals:
            target = args[0]
            own = os.getpgrp()
            if event == "os.killpg" and target not in (0, own):
                refuse("signalling processes outside the sandbox")
            if event == "os.kill" and target != 0 and not _in_group(target, own):
                refuse("signalling processes outside the sandbox")

    return hook


def _in_group(pid: int, group: int) -> bool:
    try:
        return pid > 0 and os.getpgid(pid) == group
    except OSError:
        return False


def _run_program(program: str, work: str) -> None:
    """Runs the program as ``__main__``, its directory importable, and ends as Python
    would -- except that a MemoryError exits with a code of its own."""
    import builtins
    import traceback
    import types

    sys.dont_write_bytecode = True
    sys.path.insert(0, work)
    sys.argv = [program]
    module = types.ModuleType("__main__")
    module.__file__ = program
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = module
    try:
        source = Path(program).read_text(encoding="utf-8")
        exec(compile(source, program, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        # the program's frames only: the first one is this function's call of exec
        frames = exc.__traceback__.tb_next if exc.__traceback__ else None
        traceback.print_exception(type(exc), exc, frames)
        sys.exit(MEMORY_EXIT if isinstance(exc, MemoryError) else 1)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
