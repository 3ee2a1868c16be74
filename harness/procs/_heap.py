"""A fork server's imports, kept out of its children's cyclic garbage collections.

Why: the zygote (torch: ~166 000 objects) and the node fork server (the runtime) import
once and fork many children. A full collection in a child walks every tracked object it
inherited and writes to each one's header: ~120 ms of CPU per collection over torch's heap,
and every page it writes to is copied from the one the child shared with its server
(~20 MB of a zygote worker's PSS). Objects frozen in the server (``gc.freeze``) are never
examined by a child's collections, which then look only at what the child made itself.
The collector is also off while the server imports: nothing an import makes is garbage,
and its passes over the growing heap are about a quarter of torch's import time.

What a child can tell: ``gc.get_objects()`` and ``gc.get_referrers()`` do not list the
frozen objects, ``gc.get_freeze_count()`` counts them, and a reference cycle among them is
never freed (it was alive when the child was forked).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_imports"]


@contextmanager
def frozen_imports() -> Iterator[None]:
    """Import inside: the collector is off meanwhile, and what exists afterwards (the
    imports and everything before them) is frozen, then the collector is back on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
