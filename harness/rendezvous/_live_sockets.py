"""This node's connections to its peers' liveness sockets, watched by a thread of their own.

Each node listens on a liveness socket and never accepts on it: a peer's connection waits in
the listener's backlog until the listening process is gone, and then the kernel closes it.
So a peer's connection turning readable means that peer's process died — within
milliseconds, with no timeout to wait out. Nobody ever writes to these sockets.

Why a thread that waits on them (``selectors``: epoll here, no limit of 1024 descriptors)
rather than a look at each one from the agent's monitor tick: a look costs a system call
over every peer's socket, and N agents look ten times a second. At 128 nodes that is 128
processes each reading 127 sockets every 0.1 s on a machine that also runs the job, and the
news still waits for the next tick, and for a CPU to run it on. Here the news arrives when
the kernel has it: the thread wakes, records the peer as dead and tells its owner
(``on_dead``), which wakes the agent.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable

from harness.endpoints import split_endpoint
from harness.selfpipe import close_pipe, drain_pipe, self_pipe, wake_pipe

__all__ = ["LiveSockets"]

#: how long a connection to a peer's liveness socket may take: its listener is up before
#: the peer publishes it, so a slow connect is a peer that is gone or out of reach
CONNECT_TIMEOUT = 0.3


class LiveSockets:
    """One connection to each peer's liveness socket, tried once per peer, and the peers
    whose connection the kernel has closed since (``dead()``). Nothing is opened before the
    first connection: the selector, its wake-up pipe and the thread come with it."""

    def __init__(self, on_dead: Callable[[str], None], name: str = ""):
        self._on_dead = on_dead
        self._name = name
        self._lock = threading.Lock()
        self._selector: selectors.BaseSelector | None = None
        self._socks: dict[str, socket.socket] = {}
        self._tried: set[str] = set()
        self._dead: set[str] = set()
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._closed = False

    def tried(self, node: str) -> bool:
        """Whether a connection to ``node`` was tried already (it is tried once)."""
        return node in self._tried

    def connect(self, node: str, target: str) -> None:
        """Connect to ``node``'s liveness socket at ``target`` (host:port) and watch it; a
        peer is tried once: one whose connection fails is judged by its heartbeat alone."""
        if node in self._tried or self._closed:
            return
        self._tried.add(node)
        try:
            host, port = split_endpoint(target, 0)
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
            sock.setblocking(False)
        except (OSError, ValueError):
            return
        with self._lock:
            if self._closed:
                sock.close()
                return
            selector = self._selector
            if selector is None:
                selector = self._selector = selectors.DefaultSelector()
                self._wake_r, self._wake_w = self_pipe()
                selector.register(self._wake_r, selectors.EVENT_READ, None)
                self._thread = threading.Thread(target=self._watch, args=(selector,),
                                                name=f"rdzv-liveness:{self._name}", daemon=True)
                self._thread.start()
            self._socks[node] = sock
            selector.register(sock, selectors.EVENT_READ, node)

    def dead(self) -> set[str]:
        """The peers whose process is gone (their connection was closed): no system call,
        the watching thread keeps it."""
        with self._lock:
            return set(self._dead)

    def close(self) -> None:
        """Stop the thread and close every connection; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        wake_pipe(self._wake_w)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._lock:
            socks = list(self._socks.values())
            self._socks.clear()
        for sock in socks:
            sock.close()
        if self._selector is not None:
            self._selector.close()
        close_pipe(self._wake_r, self._wake_w)
        self._wake_r = self._wake_w = -1

    # -- the thread ---------------------------------------------------------------------

    def _watch(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                ready = selector.select()
            except (OSError, ValueError):  # closed under us
                return
            for key, _ in ready:
                if key.data is None:
                    drain_pipe(self._wake_r)
                    continue
                self._read(selector, key.data, key.fileobj)  # type: ignore[arg-type]
            if self._closed:
                return

    def _read(self, selector: selectors.BaseSelector, node: str, sock: socket.socket) -> None:
        """``sock`` is readable: closed by the kernel (the peer is dead), or, were a peer
        ever to write to it, bytes that are read and dropped (never interpreted)."""
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:  # reset: the peer is gone all the same
            data = b""
        if data:
            return
        with self._lock:
            if self._closed:
                return
            selector.unregister(sock)
            self._dead.add(node)
        self._on_dead(node)
