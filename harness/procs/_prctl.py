"""Linux calls on the calling process: ``prctl`` (children die with their parent) and
``setns`` (join another process's network namespace; Python 3.11 has no ``os.setns``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable

__all__ = ["set_pdeathsig", "die_with_parent", "join_netns", "same_netns"]

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_libc: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _prctl() -> Callable[..., int]:
    return _load().prctl


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent thread dies."""
    if _prctl()(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> None:
    """Set PDEATHSIG, then exit at once if the parent already died before we could."""
    set_pdeathsig(sig)
    if os.getppid() != expected_parent:
        os._exit(1)


def join_netns(namespace: int | str) -> None:
    """Move this process into a network namespace: an open fd or a path such as
    ``/proc/<pid>/ns/net`` or ``/run/netns/<name>``. Meant for a child before it runs
    anything (a ``preexec_fn``, a fork): sockets it opens afterwards live there.
    Joining needs CAP_SYS_ADMIN; failure raises ``OSError``."""
    fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC) if isinstance(namespace, str) else namespace
    try:
        if _load().setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")
    finally:
        if isinstance(namespace, str):
            os.close(fd)


def same_netns(a: int | str, b: int | str = "/proc/self/ns/net") -> bool:
    """Whether two namespace handles (fds or paths) name the same network namespace."""
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


# resolve the libc symbols now, in the parent, so a child between fork and exec
# (preexec_fn) never has to load a library
_prctl()
_load().setns  # noqa: B018  (resolving it is the point)
