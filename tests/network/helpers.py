"""Sockets that live in a simulated node's namespace, made from the test process itself.

A thread may join a network namespace on its own (``setns`` is per thread), and a socket
stays in the namespace it was made in: so a short-lived thread enters, makes the socket and
ends, and the test drives real sockets in several namespaces without starting a process.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable

from harness.sim.net import Network

#: how long a probe waits for what must NOT arrive; what must arrive gets far longer
QUIET = 0.5
ARRIVES = 10.0


def socket_in(enter: Callable[[], None] | None, kind: int = socket.SOCK_STREAM) -> socket.socket:
    box: dict[str, object] = {}

    def make() -> None:
        try:
            if enter is not None:
                enter()
            box["sock"] = socket.socket(socket.AF_INET, kind)
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["sock"]  # type: ignore[return-value]


def listener(net: Network, node: int | None, port: int = 0) -> socket.socket:
    """A TCP listener on node ``node``'s address (None: the store's)."""
    enter = net.enter_store() if node is None else net.enter(node)
    addr = net.store_address if node is None else net.address(node)
    sock = socket_in(enter)
    sock.bind((addr, port))
    sock.listen(16)
    return sock


def connect(net: Network, node: int, target: tuple[str, int], timeout: float) -> str:
    """Connect from node ``node``: "ok", "timeout", "refused" or the error's name."""
    sock = socket_in(net.enter(node))
    sock.settimeout(timeout)
    try:
        sock.connect(target)
        return "ok"
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return type(e).__name__
    finally:
        sock.close()


def udp_pair(net: Network, sender: int, receiver: int) -> tuple[socket.socket, socket.socket]:
    """(socket in ``sender`` connected to ``receiver``'s, socket bound in ``receiver``)."""
    rx = socket_in(net.enter(receiver), socket.SOCK_DGRAM)
    rx.bind((net.address(receiver), 0))
    tx = socket_in(net.enter(sender), socket.SOCK_DGRAM)
    tx.bind((net.address(sender), 0))
    tx.connect(rx.getsockname())
    return tx, rx


def delivered(tx: socket.socket, rx: socket.socket, count: int = 1, wait: float = ARRIVES) -> int:
    """Send ``count`` datagrams; how many arrive (waiting up to ``wait`` for the first,
    then ``QUIET`` for each further one)."""
    for i in range(count):
        tx.send(b"%d" % i)
    got = 0
    rx.settimeout(wait)
    try:
        while got < count:
            rx.recv(64)
            got += 1
            rx.settimeout(QUIET)
    except TimeoutError:
        pass
    return got


def root_namespace_state() -> dict[str, str]:
    """What this machine's own network looks like (must be the same after a Network)."""
    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    links = "\n".join(sorted(line.split("@")[0].split(":")[1].strip()
                             for line in run("ip", "-o", "link").splitlines()))
    return {"links": links, "addresses": run("ip", "-o", "addr"), "routes": run("ip", "route"),
            "routes6": run("ip", "-6", "route"), "nft": run("nft", "list", "tables")}
