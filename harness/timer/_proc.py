"""Process identity for timer servers: a pid plus its start time, never a bare pid.

A pid is reused once its process is reaped, so "kill pid 1234 at 12:00" may hit a
stranger. The start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot)
tells the original process from a later one with the same pid. The signal is sent
through a pidfd opened *before* the start time is checked, so the process cannot be
swapped between the check and the kill.
"""

from __future__ import annotations

import os
import signal as _signal

__all__ = [
    "ALLOWED_SIGNALS",
    "start_time",
    "parent_pid",
    "is_descendant",
    "is_protected",
    "signal_if_same",
]

# signals a client may ask the server to reap it with; anything else (SIGSTOP, SIGCONT,
# real-time signals, ...) is refused: a timer exists to end a stuck worker
ALLOWED_SIGNALS: frozenset[int] = frozenset(
    int(s)
    for s in (
        _signal.SIGKILL,
        _signal.SIGTERM,
        _signal.SIGINT,
        _signal.SIGQUIT,
        _signal.SIGABRT,
        _signal.SIGUSR1,
        _signal.SIGUSR2,
    )
)

_MAX_DEPTH = 64


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/<pid>/stat (after the parenthesised command), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, None if there is no such process."""
    if pid <= 0:
        return None
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])  # field 22 of stat(5); fields[0] is field 3


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 2:
        return None
    return int(fields[1])  # field 4


def is_descendant(pid: int, ancestor: int) -> bool:
    """True if ``ancestor`` is a (grand...)parent of ``pid``; ``pid`` itself does not count."""
    current = pid
    for _ in range(_MAX_DEPTH):
        parent = parent_pid(current)
        if parent is None or parent <= 0:
            return False
        if parent == ancestor:
            return True
        current = parent
    return False


def is_protected(pid: int) -> bool:
    """Pids a timer server must never signal: init, itself, its parent, and non-pids
    (``kill(0)``/``kill(-1)`` reach whole process groups)."""
    return pid <= 1 or pid == os.getpid() or pid == os.getppid()


def signal_if_same(pid: int, expected_start: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process that started at
    ``expected_start``. Returns False if that process is gone (nothing to do);
    raises PermissionError and other OSErrors from the kernel."""
    if is_protected(pid):
        raise PermissionError(f"refusing to signal protected pid {pid}")
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError) as e:  # no pidfd support: check, then kill
        if isinstance(e, OSError) and e.errno not in (38, 22):  # ENOSYS, EINVAL
            raise
        if start_time(pid) != expected_start:
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True
    try:
        if start_time(pid) != expected_start:
            return False
        _signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
