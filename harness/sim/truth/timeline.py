"""``Timeline``: the merged event stream of a job, as tests and reports read it.

Agents, workers (``harness.report_step``) and the harness itself (faults, node starts and
exits) append JSON lines to one file. The timeline reads new lines incrementally: a job's
event bus (``harness.sim.bus``) calls ``refresh`` as lines arrive, and every query
refreshes first too, so a query sees every line written before it. It is safe to use from
several threads (the bus's reader, fault triggers, the test).

**Node keys.** A node is named by its integer index: the ``node`` field of agent and
worker events is the index (``HARNESS_NODE``). The harness's own events have node
``"harness"`` and name the node they concern in an integer ``target_node``; its
``node_start`` event maps the index to a display label (``label(i)``) and the agent's pid.
A ``state`` event with ``"source": "harness"`` is one the harness wrote on a node's behalf:
the terminal entry of a node it killed, froze or removed (see ``harness.sim.job``).
A timeline read from a plain ``elastic-run`` stream has host names as node keys instead.

**Fault names.** A fault event names its kind (``"fault": "kill_worker"``); the events of
older runs name some by a retired name (``worker_kill``, ``node_kill``...): the timeline
reads those in today's spelling (``harness.sim.schema.modern_event``), so every query,
the invariants and the report see one name per kind.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from harness.errors import ConfigError
from harness.sim.schema import modern_event
from harness.sim.truth.training import (
    LOST_CATEGORIES,
    FaultCost,
    Goodput,
    RankRate,
    TrainingIndex,
    annotate_steps,
    goodput,
    rank_rates,
    round_of,
)
from harness.states import WorkerState

__all__ = ["Timeline", "FaultRecord", "HARNESS"]

#: the ``node`` of the harness's own events
HARNESS = "harness"


def _order(event: dict[str, Any]) -> tuple[float, float]:
    return (event.get("mono", 0.0), event.get("ts", 0.0))


def _insert(events: list[dict[str, Any]], event: dict[str, Any]) -> None:
    """Writers append in their own order: keep the merged view time-ordered (almost always
    an append; never a re-sort of everything read so far)."""
    if not events or _order(events[-1]) <= _order(event):
        events.append(event)
    else:
        bisect.insort(events, event, key=_order)


def _node_order(node: Hashable) -> tuple[bool, Any]:
    return (isinstance(node, str), str(node) if isinstance(node, str) else node)


class FaultRecord(dict[str, Any]):
    """A fault event with its latencies (seconds, None if it never happened)."""

    @property
    def detection_latency(self) -> float | None:
        return self.get("detection_latency")

    @property
    def recovery_latency(self) -> float | None:
        return self.get("recovery_latency")

    @property
    def resume_latency(self) -> float | None:
        """Fault -> the first training step of a round that began after it (None: never)."""
        return self.get("resume_latency")

    @property
    def lost(self) -> dict[str, float]:
        """Seconds this fault cost, by category (``harness.sim.truth.training.LOST_CATEGORIES``)."""
        lost: dict[str, float] = self.get("lost") or dict.fromkeys(LOST_CATEGORIES, 0.0)
        return lost


class Timeline:
    """Reads ``path`` incrementally; every query refreshes first."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._by_kind: dict[str | None, list[dict[str, Any]]] = {}
        self._steps: dict[int, list[dict[str, Any]]] = {}  # rank -> its step events (triggers scan these)
        # worker pid -> (round, attempt): a step says which round and attempt it belongs to
        self._rounds: dict[int, tuple[int, int]] = {}
        self._unplaced: dict[int, list[dict[str, Any]]] = {}  # steps read before their worker_start
        self._known: dict[Hashable, None] = {}  # node keys, in order of appearance
        self._labels: dict[Hashable, str] = {}
        self._offset = 0
        self._partial = b""
        self._fd: int | None = None  # kept open while live (``close``): one pread per refresh
        self._read_once = False  # ``forget`` was called: the next read takes the whole file, then closes
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` is called (outside the timeline's lock) whenever new events were read."""
        self._listeners.append(listener)

    def refresh(self) -> bool:
        """Read what was appended since the last refresh; True if it added events."""
        with self._lock:
            added = self._read_new()
        if added:
            for listener in self._listeners:
                listener()
        return added

    def close(self) -> None:
        """Read what is left and let go of the file (queries keep answering from memory)."""
        self.refresh()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = -1  # closed for good: no more reads

    def forget(self) -> None:
        """Let go of the events read so far (a finished job's, once the cluster moved on):
        the next query reads them again from the file, so a cluster running jobs in a row
        keeps one job's events in memory, not every job's."""
        with self._lock:
            if self._fd is not None and self._fd >= 0:
                os.close(self._fd)
            self._fd, self._read_once = None, True
            self._offset, self._partial = 0, b""
            self._events, self._by_kind, self._steps = [], {}, {}
            self._rounds, self._unplaced, self._known, self._labels = {}, {}, {}, {}

    def _read_chunk(self) -> bytes:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return b""
        if self._fd < 0:
            return b""
        parts: list[bytes] = []
        while True:
            part = os.pread(self._fd, 1 << 20, self._offset + sum(map(len, parts)))
            if not part:
                if self._read_once:  # forgotten: the file is whole, read back in one go
                    os.close(self._fd)
                    self._fd = -1
                return b"".join(parts)
            parts.append(part)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and fd >= 0:
            os.close(fd)

    def _read_new(self) -> bool:
        chunk = self._read_chunk()
        if not chunk:
            return False  # refreshed on every query and wake: no work when nothing is new
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        added = False
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a process killed mid-write
            if isinstance(event, dict):
                self._add(event)
                added = True
        return added

    def _add(self, event: dict[str, Any]) -> None:
        event = modern_event(event)  # an older run's fault names, in today's spelling
        kind = event.get("kind")
        _insert(self._events, event)
        _insert(self._by_kind.setdefault(kind, []), event)
        if kind == "step":
            _insert(self._steps.setdefault(event.get("rank", -1), []), event)
            self._give_round(event)
        elif kind == "worker_start" and "worker_pid" in event:
            self._rounds[int(event["worker_pid"])] = round_of(event)
            for step in self._unplaced.pop(int(event["worker_pid"]), []):
                self._give_round(step)
        node = event.get("node")
        if node == HARNESS:
            if kind == "node_start":
                target = event.get("target_node")
                self._known.setdefault(target, None)
                self._labels[target] = str(event.get("label", target))
        elif isinstance(node, (int, str)):
            self._known.setdefault(node, None)

    def _give_round(self, step: dict[str, Any]) -> None:
        pid = int(step.get("pid", -1))
        found = self._rounds.get(pid)
        if found is None:
            self._unplaced.setdefault(pid, []).append(step)
        else:
            annotate_steps([step], {pid: found})

    # -- nodes ---------------------------------------------------------------------------

    def nodes(self) -> list[Hashable]:
        """Every node key seen (started by the harness or writing events), sorted."""
        self.refresh()
        with self._lock:
            return sorted(self._known, key=_node_order)

    def label(self, node: Hashable) -> str:
        """The display label of ``node`` (the harness's generated name; else the key)."""
        self._check_node(node)
        with self._lock:
            return self._labels.get(node, str(node))

    def labels(self) -> dict[Hashable, str]:
        """node -> display label, for every node (reports)."""
        return {node: self.label(node) for node in self.nodes()}

    def knows(self, node: Hashable) -> bool:
        """Whether ``node`` was seen (its ``node_start`` written, or an event of its own)."""
        self.refresh()
        with self._lock:
            return node in self._known

    def _check_node(self, node: Hashable) -> None:
        self.refresh()
        with self._lock:
            if node in self._known:
                return
            known = sorted(self._known, key=_node_order)
        raise ConfigError("node", node, f"is not a node of this timeline (nodes: {known})")

    # -- queries -------------------------------------------------------------------------

    def events(self, kind: str | None = None, node: Hashable | None = None) -> list[dict[str, Any]]:
        """Every event (optionally of one kind / node), merged and time-ordered. ``node``:
        a node key (``"harness"``: the harness's own events); an unknown one raises."""
        if node is not None and node != HARNESS:
            self._check_node(node)
        else:
            self.refresh()
        with self._lock:
            source = self._events if kind is None else self._by_kind.get(kind, [])
            if node is None:
                return list(source)
            return [e for e in source if e.get("node") == node]

    def states(self, node: Hashable) -> list[WorkerState]:
        """Every state transition of ``node``'s worker group, in order (the harness's
        terminal entry for a node it killed, froze or removed included)."""
        return [WorkerState(e["state"]) for e in self.events("state", node)]

    def world_sizes(self) -> list[int]:
        """WORLD_SIZE of each rendezvous round, in order."""
        sizes: dict[Any, int] = {}
        for event in self.events("rendezvous"):  # every node reports the round it joined
            sizes.setdefault((event.get("run_id"), event.get("round")), event["world_size"])
        return list(sizes.values())

    def restart_counts(self) -> dict[Hashable, int]:
        """node -> the highest ``TORCHELASTIC_RESTART_COUNT`` it reached (the job's count
        as far as that node saw it: nodes of one round share one count)."""
        counts: dict[Hashable, int] = {}
        for event in self.events("worker_start"):
            counts[event["node"]] = max(counts.get(event["node"], 0), event.get("restart_count", 0))
        return counts

    def results(self) -> dict[Hashable, dict[str, Any]]:
        """node -> the serialised ``RunResult`` its agent reported."""
        return {e["node"]: e["result"] for e in self.events("result")}

    def steps(self, rank: int | None = None) -> list[dict[str, Any]]:
        """``report_step`` events (of one global rank), in order."""
        if rank is None:
            return self.events("step")
        self.refresh()
        with self._lock:
            return list(self._steps.get(rank, []))

    def faults(self) -> list[FaultRecord]:
        """Faults fired, each with detection latency (fault -> first agent reaction: a
        state change, worker exit or membership change on any node), recovery latency
        (fault -> every live node HEALTHY again or finished), and what the training saw:
        resume latency and the seconds lost by category (``harness.sim.truth.training``).
        Entries the harness wrote on a node's behalf are not reactions."""
        self.refresh()
        with self._lock:
            faults = list(self._by_kind.get("fault", []))
            reacting = sorted((e for kind in ("state", "worker_exit", "membership_change")
                               for e in self._by_kind.get(kind, [])
                               if e.get("node") != HARNESS and e.get("source") != HARNESS), key=_order)
            everything = list(self._events)
        index = TrainingIndex(everything)
        records = []
        for fault in faults:
            record = FaultRecord(fault)
            start = fault["mono"]
            later = [e for e in reacting if e.get("mono", 0) > start]
            reactions = [e for e in later if e.get("state") != WorkerState.HEALTHY.value]
            record["detection_latency"] = reactions[0]["mono"] - start if reactions else None
            record["recovery_latency"] = self._recovery(later, start)
            cost = index.cost(fault, record["detection_latency"])
            record["resume_latency"], record["lost"] = cost.resume_latency, cost.lost
            records.append(record)
        return records

    def rank_rates(self, since: float | None = None, until: float | None = None) -> dict[int, RankRate]:
        """rank -> its step rate and CPU wait (``harness.sim.truth.training.rank_rates``), over the
        steps reported between the monotonic times ``since`` and ``until`` (default: all)."""
        return rank_rates(self.steps(), since, until)

    def goodput(self, records: list[FaultRecord] | None = None) -> Goodput:
        """How much of the job's wall time was training, and where the rest went;
        ``records``: this timeline's ``faults()``, when the caller already has them."""
        records = self.faults() if records is None else records
        with self._lock:
            everything = list(self._events)
        costs = [FaultCost(r.resume_latency, r.lost) for r in records]
        return goodput(everything, costs, [r["mono"] for r in records])

    @staticmethod
    def _recovery(later: Iterable[dict[str, Any]], start: float) -> float | None:
        disturbed = False
        for event in later:
            if event.get("kind") != "state":
                continue
            state = event["state"]
            if state in (WorkerState.FAILED.value, WorkerState.STOPPED.value, WorkerState.UNHEALTHY.value):
                disturbed = True
            elif disturbed and state in (WorkerState.HEALTHY.value, WorkerState.SUCCEEDED.value):
                mono: float = event["mono"]
                return mono - start
        return None

    def format(self, limit: int = 200, steps: int = 20) -> str:
        """The timeline as text, one event a line (what a failed job prints). Every event but
        the steps is kept (the last ``limit`` of them): faults, states, rounds, fences and
        worker exits are what say why a job went red, and a job's step events outnumber
        them ten to one (the last 200 events of a red flapping_link were all steps, hiding
        the fence that explained it); of the steps only the last ``steps`` are shown."""
        events = self.events()
        if not events:
            return "(no events)"
        with self._lock:
            labels = dict(self._labels)
        t0 = events[0].get("mono", 0.0)
        others = [i for i, e in enumerate(events) if e.get("kind") != "step"]
        stepped = [i for i, e in enumerate(events) if e.get("kind") == "step"]
        shown_steps = stepped[-steps:] if steps else []
        kept = sorted(set(others[-limit:]) | set(shown_steps))
        hidden = [f"{n} {what}" for n, what in ((len(stepped) - len(shown_steps), "step events"),
                                                 (len(others) - len(others[-limit:]), "earlier other events"))
                  if n]
        lines = [f"({' and '.join(hidden)} not shown)"] if hidden else []
        for e in (events[i] for i in kept):
            node = e.get("node", "?")
            shown = f"{node}:{labels[node]}" if node in labels else str(node)
            detail = {k: v for k, v in e.items() if k not in ("ts", "mono", "node", "pid", "run_id", "kind")}
            lines.append(f"{e.get('mono', 0.0) - t0:8.3f}s {shown:>16} {e.get('kind', '?'):<16} "
                         f"{json.dumps(detail, default=str)[:160]}")
        return "\n".join(lines)

    def latest(self) -> dict[str, Any] | None:
        """The newest event (None: none yet), without copying the others as ``events()`` does."""
        self.refresh()
        with self._lock:
            return self._events[-1] if self._events else None

    def __len__(self) -> int:
        self.refresh()
        with self._lock:
            return len(self._events)

    def __repr__(self) -> str:
        return f"Timeline({os.path.basename(self.path)}, {len(self._events)} events)"
