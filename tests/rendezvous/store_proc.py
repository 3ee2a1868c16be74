"""Helper processes that stand between agents and their store, for tests that need the
store outside every agent (to outlive them) or frozen (SIGSTOP: sockets stay open, no
reset, no FIN, nothing answers: what a partition looks like to the agents)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PROXY = str(Path(__file__).parent / "scripts" / "tcp_proxy.py")


class Freezable:
    """A child process that prints ``PORT n`` once it listens; freeze/thaw/close it."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "PORT":
            self.close()
            raise AssertionError(f"{argv} did not start: {line}")
        self.port = int(line[1])

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextmanager
def store_process() -> Iterator[Freezable]:
    """``python -m harness.rendezvous.store_server`` on a free loopback port."""
    store = Freezable(["-m", "harness.rendezvous.store_server", "--host", "127.0.0.1",
                       "--port", "0"])
    try:
        yield store
    finally:
        store.close()


@contextmanager
def proxy_to(port: int) -> Iterator[Freezable]:
    """A TCP relay to 127.0.0.1:``port``: freeze it to cut one agent off its store."""
    proxy = Freezable([PROXY, "127.0.0.1", str(port)])
    try:
        yield proxy
    finally:
        proxy.close()
