"""Timers over a named pipe: ``FileTimerServer`` / ``FileTimerClient``.

The wire is torch's, both ways: a client opens the FIFO ``O_WRONLY|O_NONBLOCK``,
writes one line ``{"version": 1, "pid": P, "scope_id": S, "expiration_time": T,
"signal": N}\\n`` (at most PIPE_BUF bytes, so the write is atomic) and closes it;
``expiration_time`` is wall clock, negative for a release.

The server fixes what torch's measurably gets wrong:

* the FIFO is created mode 0600 inside a private 0700 directory (or, at an explicit
  path, 0600 and never over anything but a stale FIFO of ours);
* the server holds the FIFO open ``O_RDWR|O_NONBLOCK``, so its ``open`` never blocks,
  it never sees EOF (no spinning), and it reads with ``poll`` and its own line buffer:
  a writer that keeps the FIFO open without finishing a line cannot stall expiry;
* a malformed, oversized or partial line is logged and skipped alone, never the
  requests around it;
* requests are honoured only for this process's workers (see ``HeapTimerServer``), only
  with signals from a small allow-list, and the server never signals itself (torch's
  SIGKILLs its own process, i.e. the agent, after every reap).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import select
import shutil
import signal as _signal
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.errors import ConfigError, ElasticError
from harness.selfpipe import drain_pipe, self_pipe, wake_pipe
from harness.timer._api import TimerClient, TimerExpiry, TimerRequest, TimerUnavailableError
from harness.timer._clock import Clock
from harness.timer._engine import BadRequest, HeapTimerServer
from harness.timer._proc import ALLOWED_SIGNALS

__all__ = ["FileTimerRequest", "FileTimerClient", "FileTimerServer", "MAX_LINE_BYTES"]

log = logging.getLogger(__name__)

MAX_LINE_BYTES = select.PIPE_BUF  # 4096: the largest write a pipe keeps whole
_READ_CHUNK = 65536
_READS_PER_WAKE = 16  # bounded work per wake-up: expiry is never starved by a flood
_SEND_TIMEOUT = 1.0  # the client's total retry budget (torch: 10 tries x 0.1 s)
_FIFO_NAME = "timer.fifo"


class FileTimerRequest(TimerRequest):
    """A request on the FIFO: ``TimerRequest`` plus the signal to reap the worker with."""

    __slots__ = ("version", "signal")

    def __init__(self, worker_pid: int, scope_id: str, expiration_time: float, signal: int = 0):
        super().__init__(worker_pid, scope_id, expiration_time)
        self.version = 1
        self.signal = signal

    @property
    def worker_pid(self) -> int:
        pid: int = self.worker_id  # always a pid here
        return pid

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileTimerRequest):
            return super().__eq__(other) and (self.version, self.signal) == (other.version,
                                                                                other.signal)
        return NotImplemented

    __hash__ = None

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "pid": self.worker_pid,
                           "scope_id": self.scope_id, "expiration_time": self.expiration_time,
                           "signal": self.signal})


def _check_signal(sig: Any, source: str) -> int:
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise ConfigError("signal", sig, "must be a signal number", source)
    if sig > 0 and sig not in ALLOWED_SIGNALS:
        names = ", ".join(sorted(_signal.Signals(s).name for s in ALLOWED_SIGNALS))
        raise ConfigError("signal", sig, f"must be one of {names} (or <= 0: expire without a "
                                         "signal)", source)
    return int(sig)


class FileTimerClient(TimerClient):
    """Client of ``FileTimerServer`` (ours or torch's); identifies its worker by pid.

    Opens the FIFO for every request, as torch's client does (a client that kept it open
    would stall torch's server). Retries for up to 1 s while the server is not there
    (no FIFO, no reader, pipe full), then raises ``TimerUnavailableError``
    (a BrokenPipeError).
    """

    def __init__(self, file_path: str, signal: int = _signal.SIGKILL):
        self._file_path = os.fspath(file_path)
        self.signal = _check_signal(signal, "FileTimerClient")

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._send(FileTimerRequest(os.getpid(), scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        self._send(FileTimerRequest(os.getpid(), scope_id, -1, 0))

    def _send(self, request: FileTimerRequest) -> None:
        line = request.to_json()
        if len(line) > MAX_LINE_BYTES:
            raise ConfigError("scope_id", request.scope_id[:40] + "...",
                              f"makes a {len(line)}-byte request; a request must fit in "
                              f"{MAX_LINE_BYTES} bytes (one atomic pipe write)")
        data = (line + "\n").encode()
        deadline = time.monotonic() + _SEND_TIMEOUT
        delay = 0.01
        while True:
            try:
                self._write_once(data)
                return
            except (FileNotFoundError, BlockingIOError) as e:
                problem: OSError = e
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: nobody has the FIFO open for reading
                    raise TimerUnavailableError(f"cannot send a timer request to {self._file_path}: "
                                                f"{e}") from e
                problem = e
            if time.monotonic() >= deadline:
                raise TimerUnavailableError(
                    f"no timer server at {self._file_path} after {_SEND_TIMEOUT:.1f}s ({problem}); "
                    "is the FileTimerServer running?") from problem
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _write_once(self, data: bytes) -> None:
        fd = os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise ConfigError("file_path", self._file_path, "is not a FIFO (a FileTimerServer "
                                  "creates it)", "FileTimerClient")
            os.write(fd, data)  # <= PIPE_BUF bytes: written whole or not at all (EAGAIN)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------------------
# server side


class _LineBuffer:
    """Splits a byte stream into lines of at most ``limit`` bytes.

    A line that grows past the limit keeps only its last ``limit`` bytes (the head is
    counted as dropped): when a writer leaves half a line and another's complete request
    follows, the request is at the end of the merged line and can still be recovered.
    """

    def __init__(self, limit: int):
        self._buf = bytearray()
        self._limit = limit
        self._dropped = 0

    def feed(self, data: bytes) -> list[tuple[bytes, int]]:
        """Complete lines (without newline) and how many bytes before each were dropped."""
        self._buf += data
        lines = []
        start = 0
        while (end := self._buf.find(b"\n", start)) >= 0:
            line = bytes(self._buf[start:end])
            start = end + 1
            dropped, self._dropped = self._dropped, 0
            if len(line) > self._limit:
                dropped += len(line) - self._limit
                line = line[-self._limit :]
            lines.append((line, dropped))
        del self._buf[:start]
        if len(self._buf) > self._limit:
            excess = len(self._buf) - self._limit
            self._dropped += excess
            del self._buf[:excess]
        return lines

    @property
    def pending(self) -> int:
        return len(self._buf)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a valid number here")


def _decode(line: bytes) -> tuple[Any, int]:
    """(JSON object, bytes skipped before it). A line that does not parse is retried from
    each later ``{"`` (a partial line merged with a whole one); (None, len) if none parse."""
    try:
        return json.loads(line, parse_constant=_no_constants), 0
    except ValueError:
        pass
    pos = 1
    for _ in range(16):
        start = line.find(b'{"', pos)
        if start < 0:
            break
        try:
            obj = json.loads(line[start:], parse_constant=_no_constants)
        except ValueError:
            pos = start + 1
            continue
        if isinstance(obj, dict):
            return obj, start
        pos = start + 1
    return None, len(line)


def _request_from(obj: Any) -> FileTimerRequest:
    if not isinstance(obj, dict):
        raise BadRequest("not a JSON object")
    version = obj.get("version", 1)
    if version != 1:
        raise BadRequest(f"version={version!r} is not supported (1 is)")
    try:
        pid, scope_id, expiration = obj["pid"], obj["scope_id"], obj["expiration_time"]
    except KeyError as e:
        raise BadRequest(f"field {e.args[0]!r} is missing") from None
    return FileTimerRequest(pid, scope_id, expiration, obj.get("signal", 0))


def _create_fifo(file_path: str | os.PathLike[str] | None) -> tuple[str, str | None]:
    """Make the FIFO; returns (path, private directory to remove later or None)."""
    if file_path is None or os.fspath(file_path) == "":
        directory = tempfile.mkdtemp(prefix="elastic_timer_")  # mode 0700
        path = os.path.join(directory, _FIFO_NAME)
        os.mkfifo(path, 0o600)
        return path, directory
    path = os.fspath(file_path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
            raise ConfigError("file_path", path, "exists and is not a FIFO of this user; refusing "
                              "to replace it (remove it or choose another path)", "FileTimerServer")
        os.unlink(path)  # a stale FIFO of ours: start clean, no old writer holds it
    os.mkfifo(path, 0o600)
    return path, None


def _open_fifo(path: str) -> tuple[int, tuple[int, int]]:
    """Open our end O_RDWR|O_NONBLOCK (never blocks, never EOF); check it is our FIFO."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
            raise ElasticError(f"{path} was replaced by something that is not our FIFO")
        os.fchmod(fd, 0o600)  # mkfifo's mode is masked by umask; make it exactly 0600
    except BaseException:
        os.close(fd)
        raise
    return fd, (st.st_dev, st.st_ino)


def _cleanup(fds: list[int], path: str, ident: tuple[int, int], directory: str | None,
             stopping: threading.Event | None = None) -> None:
    if stopping is not None:  # at exit without stop(): the daemon thread must end quietly
        stopping.set()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == ident:  # never remove a file someone put there since
            os.unlink(path)
    except FileNotFoundError:
        pass
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


class FileTimerServer(HeapTimerServer):
    """Server for ``FileTimerClient``s (ours or torch's) on the same host.

    ``file_path`` None picks a private path (``self.file_path``; removed with its
    directory by ``stop()``). The FIFO exists from construction on, so clients may send
    before ``start()``. ``max_interval`` bounds one wait (housekeeping), not the expiry
    precision. ``log_event(name, request)`` receives torch's event names ("watchdog
    started", "timer expired", "kill worker process", "watchdog stopped") plus
    "request rejected" and "watchdog failed".
    """

    def __init__(self, file_path: str | os.PathLike[str] | None, run_id: str, max_interval: float = 10,
                 daemon: bool = True,
                 log_event: Callable[[str, FileTimerRequest | None], None] | None = None, *,
                 clock: Clock | None = None,
                 workers: Mapping[int, int | None] | Iterable[int] | None = None,
                 on_expired: Callable[[TimerExpiry], None] | None = None):
        super().__init__(max_interval, daemon, clock=clock, run_id=run_id, workers=workers,
                         on_expired=on_expired, log_event=log_event)
        path, directory = _create_fifo(file_path)
        try:
            fd, ident = _open_fifo(path)
        except BaseException:
            _cleanup([], path, (-1, -1), directory)
            raise
        self._file_path = path
        self._fifo_fd = fd
        self._wake_r, self._wake_w = self_pipe()
        self._fd_lock = threading.Lock()
        self._closed = False
        self._poller = select.poll()
        self._poller.register(self._fifo_fd, select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)
        self._lines = _LineBuffer(MAX_LINE_BYTES)
        self._last_progress_time = int(self._clock.wall())
        self._finalizer = weakref.finalize(self, _cleanup, [fd, self._wake_r, self._wake_w],
                                           path, ident, directory, self._stop_event)

    @property
    def file_path(self) -> str:
        return self._file_path

    def get_last_progress_time(self) -> int:
        """Wall-clock second of the watchdog's last pass (torch's health-check hook)."""
        return self._last_progress_time

    def _run_watchdog(self) -> None:
        super()._run_watchdog()
        self._last_progress_time = int(self._clock.wall())

    # ---- transport --------------------------------------------------------------------

    def _receive(self, timeout: float | None) -> list[Any]:
        ms = -1 if timeout is None else max(0, math.ceil(timeout * 1000))
        requests: list[Any] = []
        for fd, _ in self._poller.poll(ms):
            if fd == self._wake_r:
                drain_pipe(self._wake_r)
            elif fd == self._fifo_fd:
                requests.extend(self._read_fifo())
        return requests

    def _read_fifo(self) -> list[FileTimerRequest]:
        requests = []
        for _ in range(_READS_PER_WAKE):
            try:
                chunk = os.read(self._fifo_fd, _READ_CHUNK)
            except BlockingIOError:
                break
            for line, dropped in self._lines.feed(chunk):
                request = self._parse_line(line, dropped)
                if request is not None:
                    requests.append(request)
            if len(chunk) < _READ_CHUNK:
                break
        return requests

    def _parse_line(self, line: bytes, dropped: int) -> FileTimerRequest | None:
        obj, skipped = _decode(line)
        events: list[Any] = []
        try:
            if obj is None:
                raise BadRequest(f"malformed line {line[:120]!r}"
                                 + (f" ({dropped} earlier bytes dropped)" if dropped else ""))
            if dropped or skipped:
                log.warning("FileTimerServer skipped %d bytes of a partial or oversized line "
                            "before a request on %s", dropped + skipped, self._file_path)
            return _request_from(obj)
        except BadRequest as e:
            self._reject(None, str(e), events)
            return None
        finally:
            self._dispatch(events)

    def _wake(self) -> None:
        with self._fd_lock:
            if self._closed:
                return
            wake_pipe(self._wake_w)  # a full pipe: a wake-up is already pending

    _restartable = False  # stop() removes the FIFO its clients were given

    def _close(self) -> None:
        with self._fd_lock:
            self._closed = True
            self._finalizer()

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]} file_path={self._file_path!r}>"
