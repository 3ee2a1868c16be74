"""Fixtures for the timer tests: child processes that are always reaped, worker
scripts, and servers that are always stopped (FIFO and private directory removed)."""

from __future__ import annotations

import os
import queue
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.timer import FileTimerServer, TimerExpiry

WORKER = str(Path(__file__).with_name("timer_worker.py"))
REPO = str(Path(__file__).resolve().parents[2])


class Children:
    """Processes started by a test; teardown kills and reaps whatever is left."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def sleeper(self) -> subprocess.Popen:
        return self._start(["sleep", "30"], stdout=subprocess.DEVNULL)

    def worker(self, mode: str, path: str, *args: object, env: dict | None = None) -> subprocess.Popen:
        full_env = {**os.environ, "PYTHONPATH": REPO, **(env or {})}
        return self._start([sys.executable, WORKER, mode, path, *map(str, args)],
                           stdout=subprocess.PIPE, env=full_env)

    def _start(self, argv: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(argv, text=True, **kwargs)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()


def read_line(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """The next stdout line of ``proc``; fails the test (not hangs) after ``timeout``."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"pid {proc.pid} printed nothing within {timeout}s (rc={proc.poll()})"
    return proc.stdout.readline().strip()


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@pytest.fixture
def children() -> Iterator[Children]:
    c = Children()
    try:
        yield c
    finally:
        c.close()


class Expiries:
    """Collects ``on_expired`` reports from a server thread."""

    def __init__(self) -> None:
        self._q: queue.Queue[TimerExpiry] = queue.Queue()

    def __call__(self, expiry: TimerExpiry) -> None:
        self._q.put(expiry)

    def next(self, timeout: float = 5.0) -> TimerExpiry:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no timer expired within {timeout}s") from None

    def empty(self) -> bool:
        return self._q.empty()


@pytest.fixture
def expiries() -> Expiries:
    return Expiries()


@pytest.fixture
def file_server(expiries: Expiries) -> Iterator[FileTimerServer]:
    """A started FileTimerServer on a private FIFO, stopped (and cleaned) at teardown."""
    server = FileTimerServer(None, "test-run", on_expired=expiries)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_file_server(expiries: Expiries) -> Iterator[Callable[..., FileTimerServer]]:
    servers: list[FileTimerServer] = []

    def make(*args, start: bool = True, **kwargs) -> FileTimerServer:
        kwargs.setdefault("on_expired", expiries)
        if not args:
            args = (None, "test-run")
        server = FileTimerServer(*args, **kwargs)
        servers.append(server)
        if start:
            server.start()
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()
