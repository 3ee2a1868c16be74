"""What runs on the host to relay a node's events (``_relay`` is the controller's side):
sent as source with ``python -I -S -c`` under the supervisor (``_remote.run``), so it
stays standard library only and is never imported there (``-I``: nothing from the remote
cwd or the user's site can shadow the standard library).

``PATH WAKE SAFETY``: follows the events file PATH (``harness.events``: one JSON object a
line, appended with ``O_APPEND``) from its start and writes every complete line to stdout,
which is the SSH channel. It binds the datagram socket WAKE, which the node's writers are
given as ``$HARNESS_EVENTS_WAKE``: each line they append is followed by a poke there, so a
line is read as soon as it is written, with no polling; the file is read again every
SAFETY seconds anyway (a lost poke, a writer without the socket). The file need not exist
yet (WAKE's dir is made if it is missing). The first line out is ``{"relay": "ready",
"wake": WAKE, "pid": N}``, once the socket is bound.

A line is forwarded only once its newline is there, whole and unchanged: the controller
checks it. A line longer than MAX_LINE is not kept in memory: it is skipped up to its
newline and reported as ``{"relay": "skipped", "bytes": N}``. On SIGTERM (the supervisor
ending it) it forwards what is in the file, then exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

#: the longest line forwarded, in bytes (the controller, which imports it, refuses longer ones too)
MAX_LINE = 1 << 20
#: the longest path a Unix socket may be bound at (sockaddr_un.sun_path, less its NUL)
SUN_PATH_MAX = 107


def _write_all(data: bytes) -> None:
    while data:
        data = data[os.write(1, data):]


def _notice(**fields: object) -> bytes:
    return (json.dumps(fields) + "\n").encode()


class _Follower:
    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None
        self.pending = b""  # the start of a line whose newline is not there yet
        self.skipping = 0  # > 0: inside a line too long to keep, this many bytes of it so far

    def forward(self) -> None:
        """Everything appended since the last call, as whole lines."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return
        while True:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return
            _write_all(self._lines(chunk))

    def _lines(self, chunk: bytes) -> bytes:
        """What ``chunk`` completes: whole lines, and a notice for each line too long."""
        out: list[bytes] = []
        while chunk:
            end = chunk.find(b"\n")
            if end < 0:
                if self.skipping:
                    self.skipping += len(chunk)
                else:
                    self.pending += chunk
                    if len(self.pending) > MAX_LINE:
                        self.skipping, self.pending = len(self.pending), b""
                return b"".join(out)
            size = self.skipping + len(self.pending) + end
            if self.skipping or size > MAX_LINE:
                out.append(_notice(relay="skipped", bytes=size))
            else:
                out.append(self.pending + chunk[:end + 1])
            self.skipping, self.pending, chunk = 0, b"", chunk[end + 1:]
        return b"".join(out)


def main(path: str, wake: str, safety: float) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        os.makedirs(os.path.dirname(wake) or ".", mode=0o700, exist_ok=True)  # the node's dir may come later
        if os.path.exists(wake):
            os.unlink(wake)
        sock.bind(wake)
    except OSError as e:
        size = len(os.fsencode(wake))
        why = (f"its path is {size} bytes, over the {SUN_PATH_MAX} a Unix socket's may be: give the host a shorter "
               "work_dir (work_dir in the hosts or Slurm file)") if size > SUN_PATH_MAX else (e.strerror or str(e))
        sys.stderr.write(f"cannot bind the wake socket {wake}: {why}\n")
        return 2
    sock.setblocking(False)
    stop_r, stop_w = os.pipe()  # SIGTERM wakes the loop through it; the loop ends between writes
    os.set_blocking(stop_r, False)
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    follower = _Follower(path)
    try:
        _write_all(_notice(relay="ready", wake=wake, pid=os.getpid()))
        while not stopping:
            follower.forward()
            for ready in select.select([sock.fileno(), stop_r], [], [], safety)[0]:
                _drain(sock if ready == sock.fileno() else None, stop_r)
        follower.forward()  # the last lines, whole
    finally:
        sock.close()
        try:
            os.unlink(wake)
        except OSError:
            pass
    return 0


def _drain(sock: socket.socket | None, pipe: int) -> None:
    try:
        while sock.recv(64) if sock is not None else os.read(pipe, 64):
            pass
    except (BlockingIOError, InterruptedError):
        pass


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.stderr.write("usage: PATH WAKE SAFETY\n")
        os._exit(2)
    try:
        status = main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
    except BrokenPipeError:  # the controller is gone: nobody to tell
        status = 0
    os._exit(status)
