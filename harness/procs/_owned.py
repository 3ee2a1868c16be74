"""Dirs named for the process that made them, removed once that process is gone.

A process that is SIGKILLed (or exits by ``os._exit``) runs no cleanup, so what it made
stays. Its makers name each dir ``<prefix><owner>...`` and, before making the next one,
remove those whose owner is gone: the caller says how its names encode the owner and when
one is gone (``harness.sim.leftovers``: a pid that no longer runs; ``harness.hosts``: a pid
and start time that are no longer one process).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

__all__ = ["remove_dead_owned"]


def remove_dead_owned(parent: str, prefix: str, owner_gone: Callable[[str], bool],
                      before_remove: Callable[[str], object] | None = None) -> list[str]:
    """Remove each ``parent/<prefix><rest>`` for which ``owner_gone(rest)``; their paths (none
    when ``parent`` cannot be listed). ``before_remove(path)`` runs first on each (what
    detaches a filesystem mounted in it)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith(prefix) or not owner_gone(name[len(prefix):]):
            continue
        path = os.path.join(parent, name)
        if before_remove is not None:
            before_remove(path)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
