"""Where a c10d rendezvous's store lives: is the endpoint this machine, and which of the
agents that share it hosts the store (an election by bind, as torch's agents do)."""

from __future__ import annotations

import errno
import socket
import time

from harness.endpoints import fqdn
from harness.rendezvous._store import StoreServer

__all__ = ["elect_store_host", "is_local_host"]


def is_local_host(host: str) -> bool:
    """Does ``host`` name this machine (loopback, hostname, FQDN or one of its addresses)?"""
    if host in ("localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):
        return True
    names = {socket.gethostname(), fqdn()}
    if host in names:
        return True
    try:
        mine = {info[4][0] for name in names for info in socket.getaddrinfo(name, None)}
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(mine & theirs) or any(str(a).startswith("127.") or a == "::1" for a in theirs)


def _someone_listens(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def elect_store_host(host: str, port: int, attempts: int = 50) -> StoreServer | None:
    """Host the store on ``port`` unless another agent already does; None: join as client.

    Two agents binding at the same moment can *both* lose: with SO_REUSEADDR both binds
    succeed while neither listens, then each listen() sees the other's socket and fails
    with EADDRINUSE (2 of 40 simultaneous starts here). So a lost election counts only if
    someone really listens; otherwise retry after a short random backoff."""
    import random

    for _ in range(attempts):
        try:
            return StoreServer("", port).start()
        except OSError as e:
            if e.errno != errno.EADDRINUSE or _someone_listens(host, port):
                return None
        time.sleep(random.uniform(0.002, 0.03))
    return None
