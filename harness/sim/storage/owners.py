"""Which node a process belongs to: the caller's pid (FUSE's request context) to a node.

The harness records every node agent's pid (``node_start``) and every worker's
(``worker_start``, from the agent) in the job's event file. A caller is a thread of some
process: its thread group, then its parents up the chain, until one is an agent or a
worker of the job (a worker forked by the zygote is no child of its agent, but it is
recorded; a data-loader process it forks is its child). A pid recorded later than its
first file operation (a worker writes before its agent logged its start) is waited for,
briefly, by re-reading the event file. Answers are cached per (pid, start time), so a
reused pid is never taken for the process that had it before; "no node" is never cached
(it may be a worker not recorded yet).
"""

from __future__ import annotations

import json
import os
import threading
import time

__all__ = ["Owners", "HARNESS_OWNER"]

HARNESS_OWNER = None  # what the harness itself (or any process of no node) is


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(thread group id, parent pid, start time) of a thread or process; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    ppid, start = int(fields[1]), int(fields[19])
    tgid = pid
    try:
        with open(f"/proc/{pid}/status", "rb") as fp:
            for line in fp:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                    break
    except OSError:
        return None
    return tgid, ppid, start


class Owners:
    """pid -> node, from the job's event file."""

    def __init__(self, events_path: str | None, wait: float = 2.0):
        self._events_path = events_path
        self._offset = 0
        self._pids: dict[int, int] = {}  # agent or worker pid -> node
        self._cache: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._wait = wait

    def add(self, pid: int, node: int) -> None:
        with self._lock:
            self._pids[pid] = node

    def node_of(self, pid: int) -> int | None:
        """The node of the process (or thread) ``pid``; None: no node's (the harness)."""
        if pid <= 0:
            return HARNESS_OWNER
        stat = _stat(pid)
        if stat is None:
            return HARNESS_OWNER
        if stat[0] == os.getppid():  # the harness itself
            return HARNESS_OWNER
        key = (stat[0], stat[2])
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        node = self._resolve(pid, stat)
        if node is not HARNESS_OWNER:
            with self._lock:
                self._cache[key] = node
        return node

    def _resolve(self, pid: int, stat: tuple[int, int, int]) -> int | None:
        deadline = time.monotonic() + self._wait
        while True:
            chain = self._chain(pid, stat)
            with self._lock:
                self._read_events()
                for p in chain:
                    if p in self._pids:
                        return self._pids[p]
            # not recorded (yet): wait for the agent to log the worker it started
            if time.monotonic() >= deadline:
                return HARNESS_OWNER
            time.sleep(0.005)

    @staticmethod
    def _chain(pid: int, stat: tuple[int, int, int]) -> list[int]:
        chain = [stat[0]]
        ppid = stat[1]
        while ppid > 1 and len(chain) < 64:
            chain.append(ppid)
            parent = _stat(ppid)
            if parent is None:
                break
            ppid = parent[1]
        return chain

    def _read_events(self) -> None:
        if self._events_path is None:
            return
        try:
            with open(self._events_path, "rb") as fp:
                fp.seek(self._offset)
                data = fp.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            if b"_start" not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("kind") == "node_start" and "pid" in event:
                self._pids[int(event["pid"])] = int(event["target_node"])
            elif event.get("kind") == "worker_start" and isinstance(event.get("node"), int):
                self._pids[int(event["worker_pid"])] = event["node"]
