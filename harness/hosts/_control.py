"""The private local dir of one SSH connection: its control socket and the master's log.

OpenSSH removes its control socket when the master exits, even on SIGTERM, but a
controller that is SIGKILLed cannot remove the dir around it. Each dir is therefore named
``pe-ssh-<owner pid>-<owner start time>-<random>`` and the next connection made on this
machine removes those whose owner is gone. The start time makes the owner a process, not a
pid: a reused pid is not mistaken for the owner (``harness.procs.is_same_process``).
"""

from __future__ import annotations

import os
import tempfile

from harness.procs import is_same_process, process_start_time, remove_dead_owned

__all__ = ["PREFIX", "make_control_dir", "sweep_dead_owners"]

PREFIX = "pe-ssh-"
#: a Unix socket path must fit sun_path (108 bytes on Linux, 104 elsewhere), with ssh's own
#: temporary suffix (".XXXXXXXXXXXXXXXX") appended while the master binds it
_MAX_SOCKET_PATH = 104 - 17


def _owner_gone(rest: str) -> bool:
    """``rest``: a dir's name after the prefix, ``<owner pid>-<owner start time>-<random>``."""
    fields = rest.split("-")
    if len(fields) != 3 or not (fields[0].isdigit() and fields[1].isdigit()):
        return False
    return not is_same_process(int(fields[0]), int(fields[1]))


def sweep_dead_owners(parent: str) -> list[str]:
    """Remove the control dirs in ``parent`` whose owner process is gone; their paths."""
    return remove_dead_owned(parent, PREFIX, _owner_gone)


def make_control_dir(socket_name: str) -> str:
    """A new 0700 dir for this process's connection, after sweeping dead owners' ones. In
    the temp dir, or in /tmp where the temp dir's path is too long for a socket."""
    parent = tempfile.gettempdir()
    if len(os.path.join(parent, f"{PREFIX}{os.getpid()}-{2 ** 63}-xxxxxxxx", socket_name)) > _MAX_SOCKET_PATH:
        parent = "/tmp"
    sweep_dead_owners(parent)
    started = process_start_time(os.getpid())
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{started}-", dir=parent)
