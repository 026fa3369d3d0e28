"""A slow, high-latency link on this machine: a network namespace of the harness's own
behind a veth pair, shaped with ``tc``; everything it creates is removed on exit.

The link's two ends get a private /30 (10.231.X.0/30, X from this process id). With the
``netem`` qdisc the delay and the rate are the kernel's (``netem delay D rate R`` on both
ends). Kernels without ``netem`` (this machine's) still shape the rate in the kernel
(``tbf``), and the delay is added by a relay inside the namespace (delay_relay.py)
through which the remote side reaches the data layer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RELAY = Path(__file__).with_name("delay_relay.py")
RELAY_PORT = 18700


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


class ShapedLink:
    def __init__(self, delay_ms: int = 150, rate: str = "50mbit") -> None:
        tag = os.getpid() % 250
        self.ns = f"afx{os.getpid()}"
        self.host_if, self.ns_if = f"afh{os.getpid()}", f"afn{os.getpid()}"
        self.host_ip, self.ns_ip = f"10.231.{tag}.1", f"10.231.{tag}.2"
        self.delay_ms, self.rate = delay_ms, rate
        self.shaping = ""
        self.relay: subprocess.Popen | None = None
        self.processes: list[subprocess.Popen] = []

    def _run(self, *args: str, ns: bool = False) -> None:
        cmd = ["netns", "exec", self.ns, "ip", *args] if ns else list(args)
        done = _ip(*cmd)
        if done.returncode:
            raise OSError(f"ip {' '.join(cmd)}: {done.stderr.strip()}")

    def _shape(self) -> None:
        netem = ["qdisc", "add", "dev", "{dev}", "root", "netem", "delay",
                 f"{self.delay_ms}ms", "rate", self.rate]
        tbf = ["qdisc", "add", "dev", "{dev}", "root", "tbf", "rate", self.rate,
               "burst", "64kb", "latency", "2s"]
        for spec, label in ((netem, "netem"), (tbf, "tbf+relay")):
            try:
                for dev, ns in ((self.host_if, False), (self.ns_if, True)):
                    args = [a.format(dev=dev) for a in spec]
                    cmd = ["netns", "exec", self.ns, "tc", *args] if ns else None
                    done = (subprocess.run(["ip", *cmd], capture_output=True, text=True)
                            if ns else subprocess.run(["tc", *args], capture_output=True,
                                                      text=True))
                    if done.returncode:
                        raise OSError(done.stderr.strip())
                self.shaping = label
                return
            except OSError:
                for dev, ns in ((self.host_if, False), (self.ns_if, True)):
                    base = ["tc", "qdisc", "del", "dev", dev, "root"]
                    subprocess.run(["ip", "netns", "exec", self.ns, *base] if ns else base,
                                   capture_output=True)
        raise OSError("neither tc netem nor tc tbf is available")

    def __enter__(self) -> ShapedLink:
        if os.geteuid() != 0:
            pytest.skip("the cross-region harness creates network namespaces: needs root")
        try:
            self._run("netns", "add", self.ns)
        except OSError as exc:
            pytest.skip(f"cannot create a network namespace here: {exc}")
        try:
            self._run("link", "set", "lo", "up", ns=True)
            self._run("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            self._run("link", "set", self.ns_if, "netns", self.ns)
            self._run("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            self._run("link", "set", self.host_if, "up")
            self._run("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if, ns=True)
            self._run("link", "set", self.ns_if, "up", ns=True)
            self._shape()
        except OSError as exc:
            self.__exit__()
            pytest.skip(f"cannot build the shaped link: {exc}")
        return self

    def url(self, port: int) -> str:
        """The data layer at ``host_ip:port`` as seen from inside the namespace."""
        if self.shaping == "netem":
            return f"http://{self.host_ip}:{port}"
        if self.relay is None:
            self.relay = self.popen(
                [sys.executable, str(RELAY), "127.0.0.1", str(RELAY_PORT), self.host_ip,
                 str(port), str(self.delay_ms / 1000)], stdout=subprocess.PIPE, text=True)
            assert self.relay.stdout.readline().strip() == "relay ready"
        return f"http://127.0.0.1:{RELAY_PORT}"

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        """A process inside the namespace (stopped on exit)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], **kw)
        self.processes.append(proc)
        return proc

    def __exit__(self, *exc: object) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        _ip("link", "del", self.host_if)
        _ip("netns", "del", self.ns)
