"""The event stream: one JSON object per line, appended to ``$HARNESS_EVENTS``.

Each event is a single ``os.write`` on an ``O_APPEND`` descriptor, so lines from
concurrent agents never interleave (writes up to PIPE_BUF are atomic, larger ones are
still appended whole on local filesystems). The file is the durable record.

A reader that wants to hear of new lines at once (the simulation's event bus) names a
Unix datagram socket in ``$HARNESS_EVENTS_WAKE``: after each line the writer sends it one
byte. The datagram carries no data, only "look again", so a lost one loses nothing (the
reader re-reads the file on its own now and then). It is a filesystem-path socket, not an
abstract one, so it reaches a reader in another network namespace. Writers never depend
on a reader: no socket, a full queue or a dead reader are all silently ignored.

``$HARNESS_NODE`` names the writer's node; an all-digit value is stamped as an integer
(the simulation's node index), anything else as given (a host name).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["EVENTS_ENV", "NODE_ENV", "WAKE_ENV", "EventWriter", "NullEventWriter",
           "event_writer_from_env", "node_key"]

#: the job's event file every agent and worker appends its events to (unset: no events)
EVENTS_ENV = "HARNESS_EVENTS"
#: the node an agent or worker writes its events as (its label)
NODE_ENV = "HARNESS_NODE"
#: the harness's wake socket, poked after each event written
WAKE_ENV = "HARNESS_EVENTS_WAKE"


def node_key(value: str) -> int | str:
    """A node's key in the event stream: its integer index when ``value`` is one."""
    return int(value) if value.isdigit() else value


class NullEventWriter:
    """Used when no event file is configured."""

    enabled = False

    def emit(self, kind: str, **fields: Any) -> None:
        pass

    def close(self) -> None:
        pass


class EventWriter:
    """Appends events for one agent; ``node`` and ``run_id`` are stamped on every line.
    ``wake``: a datagram socket path poked after each line (see the module doc)."""

    enabled = True

    def __init__(self, path: str, node: int | str, run_id: str = "", wake: str | None = None):
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.node = node
        self.run_id = run_id
        self._pid = os.getpid()
        self._wake_path = wake or None
        self._wake: socket.socket | None = None
        if self._wake_path:
            self._wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._wake.setblocking(False)
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields: Any) -> None:
        event = {"ts": time.time(), "mono": time.monotonic(), "node": self.node,
                 "pid": self._pid, "run_id": self.run_id, "kind": kind}
        event.update(fields)
        self.write(event)

    def write(self, event: Mapping[str, Any]) -> None:
        """Append ``event`` as it is: ``emit`` stamps its own; a node on a host's relay
        (``harness.sim.places.hosts.nodes``) hands on events stamped there. One ``os.write`` per
        line, so concurrent writers (threads, processes: ``O_APPEND``) never interleave; the
        lock keeps a write off a descriptor ``close`` has given back (and the kernel may
        have handed to another file)."""
        line = (json.dumps(event, default=repr, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, line)
            except OSError:
                return  # a full disk must not take the agent down
            if self._wake is not None and self._wake_path:  # the socket exists only with a path
                try:
                    self._wake.sendto(b".", self._wake_path)
                except OSError:
                    pass  # no reader, a full queue: the file still has the line

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._wake is not None:
                self._wake.close()
                self._wake = None


def event_writer_from_env(env: Mapping[str, str], run_id: str, default_node: str) -> EventWriter | NullEventWriter:
    """Resolve the writer once, at the edge, from an environment mapping."""
    path = env.get(EVENTS_ENV)
    if not path:
        return NullEventWriter()
    return EventWriter(path, node_key(env.get(NODE_ENV) or default_node), run_id, env.get(WAKE_ENV))
