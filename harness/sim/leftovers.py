"""Temp dirs of harness processes that died without closing (SIGTERM, SIGKILL, ``os._exit``).

Such a process runs no ``close()`` and no finalizer, so what it made stays. Every dir made
here is named ``<prefix><owner pid>_<random>``, and the next one made with that prefix, in
any process, first removes those whose owner is dead (a zombie too: it will never close
anything) and never one whose owner still runs (a reused pid only delays the removal).
The namespaces follow the same rule (``harness.sim.net.names``), and so do the jobs'
filesystems: a dir that may hold a dead owner's mounts is made with ``before_remove`` set to
what detaches them (the cluster's: ``harness.sim.storage.mount.sweep``), so this module, below
every room that uses it, knows nothing of storage.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from harness.procs import process_state, remove_dead_owned

__all__ = ["owner_alive", "owned_tempdir", "remove_dead_owners"]


def owner_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not: it will never close what it made)."""
    return process_state(pid) not in (None, "Z")


def _pid_gone(rest: str) -> bool:
    pid = rest.split("_", 1)[0]
    return pid.isdigit() and not owner_alive(int(pid))


def remove_dead_owners(prefix: str, parent: str, before_remove: Callable[[str], object] | None = None) -> list[str]:
    """Remove the dirs ``parent/<prefix><pid>_*`` whose owner pid is dead; their paths.
    ``before_remove(path)`` runs first on each (e.g. what detaches a job filesystem its dead
    owner left mounted there)."""
    return remove_dead_owned(parent, prefix, _pid_gone, before_remove)


def owned_tempdir(prefix: str, parent: str | None = None,
                  before_remove: Callable[[str], object] | None = None) -> str:
    """A new temp dir named for this process, made after removing dead owners' ones
    (``before_remove``: as in ``remove_dead_owners``)."""
    parent = parent if parent is not None else tempfile.gettempdir()
    remove_dead_owners(prefix, parent, before_remove)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}_", dir=parent)
