"""A network of its own for one node: a namespace behind a veth pair whose link can be
cut (every packet dropped) and healed, for ``bench/chaos.py``."""

from __future__ import annotations

import subprocess
from typing import Any


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


class FarLink:
    """A network namespace behind a veth pair: the far node's own network. ``cut()``
    drops every packet both ways (a token bucket too small to pass one), ``heal()``
    lets them through again."""

    def __init__(self, tag: int) -> None:
        self.ns, self.host_if, self.ns_if = (f"afc{tag}", f"afch{tag}", f"afcn{tag}")
        self.host_ip, self.ns_ip = f"10.232.{tag}.1", f"10.232.{tag}.2"
        self.up = False

    def __enter__(self) -> FarLink:
        steps = [("netns", "add", self.ns),
                 ("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if),
                 ("link", "set", self.ns_if, "netns", self.ns),
                 ("addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
                 ("link", "set", self.host_if, "up"),
                 ("netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/30", "dev",
                  self.ns_if),
                 ("netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up"),
                 ("netns", "exec", self.ns, "ip", "link", "set", "lo", "up")]
        for step in steps:
            done = _ip(*step)
            if done.returncode:
                self.__exit__()
                raise OSError(f"ip {' '.join(step)}: {done.stderr.strip()}")
        self.up = True
        return self

    def _tc(self, *args: str) -> None:
        for prefix, dev in (([], self.host_if), (["ip", "netns", "exec", self.ns], self.ns_if)):
            cmd = [*prefix, "tc", "qdisc", *[a.format(dev=dev) for a in args]]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise OSError(f"{' '.join(cmd)}: {done.stderr.strip()}")

    def cut(self) -> None:
        self._tc("add", "dev", "{dev}", "root", "tbf", "rate", "8bit", "burst", "100",
                 "limit", "1")

    def heal(self) -> None:
        self._tc("del", "dev", "{dev}", "root")

    def popen(self, cmd: list[str], **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], **kw)

    def __exit__(self, *exc: object) -> None:
        _ip("link", "del", self.host_if)
        _ip("netns", "del", self.ns)
