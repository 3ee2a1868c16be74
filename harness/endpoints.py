"""Ports and endpoints: ``host[:port]`` parsing, this host's name, and a held port.

``PortReservation`` holds a port for a TCPStore that someone else (worker rank 0) will
host: the socket is bound with SO_REUSEADDR but never listens, so the kernel hands the
port to no other ``bind(0)`` while the store, which also sets SO_REUSEADDR, can still
bind and listen on it. This closes torch's ``get_free_port()`` bind-then-close race.

Named for what it holds: it was ``harness.net`` until that sat beside the simulated
network (``harness.sim.net``) and read as part of it; ``harness.net`` stays a deprecated
alias.
"""

from __future__ import annotations

import functools
import socket

__all__ = ["PortReservation", "fqdn", "split_endpoint"]


class PortReservation:
    """A port kept out of the ephemeral pool until ``release()``."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0):
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._sock is not None else "released"
        return f"PortReservation(port={self.port}, {state})"


@functools.cache
def fqdn() -> str:
    """The host's FQDN, as torchrun puts it in MASTER_ADDR (looked up once)."""
    return socket.getfqdn()


def split_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` too) -> (host, port); raises ValueError if malformed."""
    endpoint = endpoint.strip()
    if not endpoint:
        raise ValueError("endpoint is empty")
    if endpoint.startswith("["):
        host, sep, rest = endpoint[1:].partition("]")
        if not sep:
            raise ValueError(f"unbalanced '[' in {endpoint!r}")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected text after ']' in {endpoint!r}")
    elif endpoint.count(":") == 1:
        host, _, port_text = endpoint.partition(":")
    else:
        host, port_text = endpoint, ""
    if not host:
        raise ValueError(f"no host in {endpoint!r}")
    if port_text == "":
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise ValueError(f"port {port_text!r} in {endpoint!r} is not in 0..65535")
    return host, int(port_text)
