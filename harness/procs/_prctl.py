"""Linux ``prctl`` calls that make children die with their parent."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

__all__ = ["set_pdeathsig", "die_with_parent"]

_PR_SET_PDEATHSIG = 1
_libc = None


def _prctl():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc.prctl


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


# resolve the libc symbol now, in the parent, so a child between fork and exec
# (preexec_fn) never has to load a library
_prctl()
