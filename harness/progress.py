"""``report_step``: the one line a worker adds so faults can be keyed by (rank, step)."""

from __future__ import annotations

import os

from harness.events import EVENTS_ENV, NODE_ENV, EventWriter

__all__ = ["report_step"]

_writer: EventWriter | None = None
_writer_pid: int | None = None


def report_step(step: int, **fields: object) -> None:
    """Record that this worker reached training ``step`` (a no-op outside the harness)."""
    global _writer, _writer_pid
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    if _writer is None or _writer_pid != os.getpid():  # re-open after a fork
        _writer = EventWriter(path, os.environ.get(NODE_ENV, "?"), os.environ.get("TORCHELASTIC_RUN_ID", ""))
        _writer_pid = os.getpid()
    _writer.emit("step", step=int(step), rank=int(os.environ.get("RANK", -1)),
                 local_rank=int(os.environ.get("LOCAL_RANK", -1)),
                 restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), **fields)
