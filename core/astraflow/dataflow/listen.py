"""The data layer's listening socket, kept apart from the server so that a launcher can
bind it (and know the URL) without importing the web stack."""

from __future__ import annotations

import socket


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: the event loop only sets TCP_NODELAY on such sockets, and
    # without it a reply written in two parts waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def inherited(fd: int) -> socket.socket:
    """A listening socket a parent process passed down (``--fd``)."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def url(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
