"""Copy worker output lines to a log file and, prefixed, to the console.

One thread serves every pipe of a worker group with a selector (torch runs a thread per
file and polls each every 0.1 s). Lines are written whole so ranks never interleave
mid-line.
"""

from __future__ import annotations

import os
import selectors
import threading
from dataclasses import dataclass
from typing import BinaryIO

from harness.selfpipe import drain_pipe, self_pipe, wake_pipe

__all__ = ["TeeSink", "TeePump"]


@dataclass
class TeeSink:
    """Where the lines of one pipe go."""

    file: BinaryIO | None
    console: BinaryIO | None
    prefix: bytes


class TeePump:
    """Reads pipes until EOF; ``close`` waits (bounded) for the pipes to drain."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = self_pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._partial: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def add(self, fd: int, sink: TeeSink) -> None:
        os.set_blocking(fd, False)
        with self._lock:
            self._selector.register(fd, selectors.EVENT_READ, sink)
            self._partial[fd] = b""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="elastic-tee", daemon=True)
            self._thread.start()
        else:
            wake_pipe(self._wake_w)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping and len(self._selector.get_map()) <= 1:
                    return
            for key, _ in self._selector.select(timeout=0.5):
                if key.data is None:
                    drain_pipe(self._wake_r)
                    continue
                self._pump(key.fd, key.data)

    def _pump(self, fd: int, sink: TeeSink) -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        data = self._partial.get(fd, b"") + chunk
        if chunk:
            *lines, rest = data.split(b"\n")
            self._partial[fd] = rest
        else:
            lines = [data] if data else []
            with self._lock:
                self._selector.unregister(fd)
                self._partial.pop(fd, None)
            os.close(fd)
        for line in lines:
            self._emit(sink, line + b"\n")
        if not chunk:
            self._flush(sink)

    @staticmethod
    def _emit(sink: TeeSink, line: bytes) -> None:
        if sink.file is not None:
            sink.file.write(line)
        if sink.console is not None:
            sink.console.write(sink.prefix + line)
            sink.console.flush()

    @staticmethod
    def _flush(sink: TeeSink) -> None:
        if sink.file is not None:
            sink.file.flush()

    def close(self, timeout: float = 2.0) -> None:
        """Stop once every pipe reached EOF (or after ``timeout``), then release fds."""
        with self._lock:
            self._stopping = True
        if self._thread is not None:
            wake_pipe(self._wake_w)
            self._thread.join(timeout)
        with self._lock:
            for key in list(self._selector.get_map().values()):
                if key.data is not None:
                    os.close(key.fd)
            self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
