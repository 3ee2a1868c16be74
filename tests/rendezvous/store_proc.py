"""A standalone rendezvous store (``python -m harness.rendezvous.store_server``) for tests
that need the store outside every agent: to outlive them, or to be frozen (SIGSTOP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class StoreProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.rendezvous.store_server", "--host", "127.0.0.1",
             "--port", "0"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "PORT", f"store server did not start: {line}"
        self.port = int(line[1])

    def freeze(self) -> None:
        """SIGSTOP: the store keeps its sockets but answers nothing (like a partition)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
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
def store_process() -> Iterator[StoreProcess]:
    store = StoreProcess()
    try:
        yield store
    finally:
        store.close()
