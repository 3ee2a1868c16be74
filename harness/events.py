"""The event stream: one JSON object per line, appended to ``$HARNESS_EVENTS``.

Each event is a single ``os.write`` on an ``O_APPEND`` descriptor, so lines from
concurrent agents never interleave (writes up to PIPE_BUF are atomic, larger ones are
still appended whole on local filesystems). Agents never depend on a reader.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["EVENTS_ENV", "NODE_ENV", "EventWriter", "NullEventWriter", "event_writer_from_env"]

EVENTS_ENV = "HARNESS_EVENTS"
NODE_ENV = "HARNESS_NODE"


class NullEventWriter:
    """Used when no event file is configured."""

    enabled = False

    def emit(self, kind: str, **fields: Any) -> None:
        pass

    def close(self) -> None:
        pass


class EventWriter:
    """Appends events for one agent; ``node`` and ``run_id`` are stamped on every line."""

    enabled = True

    def __init__(self, path: str, node: str, run_id: str = ""):
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.node = node
        self.run_id = run_id
        self._pid = os.getpid()

    def emit(self, kind: str, **fields: Any) -> None:
        if self._fd is None:
            return
        event = {"ts": time.time(), "mono": time.monotonic(), "node": self.node,
                 "pid": self._pid, "run_id": self.run_id, "kind": kind}
        event.update(fields)
        line = json.dumps(event, default=repr, separators=(",", ":")) + "\n"
        try:
            os.write(self._fd, line.encode())
        except OSError:
            pass  # a full disk must not take the agent down

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def event_writer_from_env(env: dict[str, str], run_id: str, default_node: str) -> EventWriter | NullEventWriter:
    """Resolve the writer once, at the edge, from an environment mapping."""
    path = env.get(EVENTS_ENV)
    if not path:
        return NullEventWriter()
    return EventWriter(path, env.get(NODE_ENV) or default_node, run_id)
