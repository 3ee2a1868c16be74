"""The self-pipe: how a thread or a signal handler wakes a loop blocked in ``select``.

A loop that waits on sockets or FIFOs with ``select``/``selectors`` also watches the read
end of a pipe; whoever has news writes a byte to the write end. Both ends are
non-blocking, so a writer never blocks on a full pipe (the loop is already due to wake:
a lost byte loses nothing) and the loop empties the read end without blocking
(``drain_pipe``), or the pipe would stay readable and ``select`` would spin.

One helper for every loop of the project (the c10d rendezvous, the file timer server,
the simulation's event bus and node fork server), so each gets the same edge cases
right: a pipe closed under a racing ``close()`` is drained too (nothing left to read).
Standard library only, cheap to import: worker processes load it with the timer client.
"""

from __future__ import annotations

import os

__all__ = ["close_pipe", "drain_pipe", "self_pipe", "wake_pipe"]


def self_pipe() -> tuple[int, int]:
    """A new ``(read_fd, write_fd)`` pair, both non-blocking and close-on-exec."""
    return os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)


def drain_pipe(fd: int) -> None:
    """Read ``fd`` (a non-blocking pipe) until it is empty, closed or gone.

    Every wake-up byte written so far is consumed, however many: the loop that calls this
    looks at everything it watches afterwards, so one pass answers them all."""
    try:
        while os.read(fd, 4096):
            pass
    except OSError:  # BlockingIOError: empty; EBADF: closed by a racing close()
        pass


def wake_pipe(fd: int) -> None:
    """Write one wake-up byte to ``fd`` (a non-blocking pipe's write end); a full or
    closed pipe is ignored (a full one already wakes its reader)."""
    try:
        os.write(fd, b"!")
    except OSError:
        pass


def close_pipe(read_fd: int, write_fd: int) -> None:
    """Close both ends of a self-pipe; an end that is -1 (never opened) or already closed
    is skipped, so a ``close()`` that runs twice, or before the pipe was made, is safe."""
    for fd in (read_fd, write_fd):
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
