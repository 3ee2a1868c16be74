"""``Timeline``: the merged event stream of a job, as tests and reports read it.

Agents, workers (``harness.report_step``) and the harness itself (faults) append JSON
lines to one file; the timeline reads new lines on demand and answers questions about
states, rounds, restarts and faults.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from harness.agent import WorkerState

__all__ = ["Timeline", "FaultRecord"]


class FaultRecord(dict):
    """A fault event with its latencies (seconds, None if it never happened)."""

    @property
    def detection_latency(self) -> float | None:
        return self.get("detection_latency")

    @property
    def recovery_latency(self) -> float | None:
        return self.get("recovery_latency")


class Timeline:
    """Reads ``path`` incrementally; every query refreshes first."""

    def __init__(self, path: str):
        self.path = path
        self._events: list[dict] = []
        self._offset = 0
        self._partial = b""

    def refresh(self) -> None:
        try:
            with open(self.path, "rb") as fp:
                fp.seek(self._offset)
                chunk = fp.read()
        except FileNotFoundError:
            return
        if not chunk:
            return  # polled every few ms by waiters and triggers: no work when nothing is new
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        added = False
        for line in lines:
            if not line.strip():
                continue
            try:
                self._events.append(json.loads(line))
                added = True
            except json.JSONDecodeError:
                continue  # a torn line from a process killed mid-write
        if added:  # writers append in their own order: keep the merged view time-ordered
            self._events.sort(key=lambda e: (e.get("mono", 0.0), e.get("ts", 0.0)))

    # -- queries -------------------------------------------------------------------------

    def events(self, kind: str | None = None, node: str | None = None) -> list[dict]:
        """Every event (optionally of one kind / node), merged and time-ordered."""
        self.refresh()
        return [e for e in self._events
                if (kind is None or e.get("kind") == kind) and (node is None or e.get("node") == node)]

    def nodes(self) -> list[str]:
        seen: dict[str, None] = {}
        for event in self.events("state"):
            seen.setdefault(event["node"], None)
        return list(seen)

    def states(self, node: str) -> list[WorkerState]:
        """Every state transition of ``node``'s worker group, in order."""
        return [WorkerState(e["state"]) for e in self.events("state", node)]

    def world_sizes(self) -> list[int]:
        """WORLD_SIZE of each rendezvous round, in order."""
        sizes: dict[Any, int] = {}
        for event in self.events("rendezvous"):  # every node reports the round it joined
            sizes.setdefault((event.get("run_id"), event.get("round")), event["world_size"])
        return list(sizes.values())

    def restart_counts(self) -> dict[str, int]:
        """The highest ``TORCHELASTIC_RESTART_COUNT`` each node reached."""
        counts: dict[str, int] = {}
        for event in self.events("worker_start"):
            counts[event["node"]] = max(counts.get(event["node"], 0), event.get("restart_count", 0))
        return counts

    def results(self) -> dict[str, dict]:
        return {e["node"]: e["result"] for e in self.events("result")}

    def steps(self, rank: int | None = None) -> list[dict]:
        return [e for e in self.events("step") if rank is None or e.get("rank") == rank]

    def faults(self) -> list[FaultRecord]:
        """Faults fired, each with detection latency (fault -> first agent reaction: a
        state change, worker exit or membership change on any node) and recovery latency
        (fault -> every live node HEALTHY again or finished)."""
        events = self.events()
        records = []
        for i, fault in enumerate(e for e in events if e.get("kind") == "fault"):
            record = FaultRecord(fault)
            start = fault["mono"]
            later = [e for e in events if e.get("mono", 0) > start and e.get("node") != "harness"
                     and e.get("kind") != "fault"]
            reactions = [e for e in later if e.get("kind") in ("state", "worker_exit", "membership_change")
                         and e.get("state") != WorkerState.HEALTHY.value]
            record["detection_latency"] = reactions[0]["mono"] - start if reactions else None
            record["recovery_latency"] = self._recovery(later, start)
            records.append(record)
        return records

    @staticmethod
    def _recovery(later: Iterable[dict], start: float) -> float | None:
        disturbed = False
        for event in later:
            if event.get("kind") != "state":
                continue
            state = event["state"]
            if state in (WorkerState.FAILED.value, WorkerState.STOPPED.value, WorkerState.UNHEALTHY.value):
                disturbed = True
            elif disturbed and state in (WorkerState.HEALTHY.value, WorkerState.SUCCEEDED.value):
                return event["mono"] - start
        return None

    def format(self, limit: int = 200) -> str:
        """The timeline as text, one event a line (what an invariant failure prints)."""
        events = self.events()
        if not events:
            return "(no events)"
        t0 = events[0].get("mono", 0.0)
        lines = []
        for e in events[-limit:]:
            detail = {k: v for k, v in e.items() if k not in ("ts", "mono", "node", "pid", "run_id", "kind")}
            lines.append(f"{e.get('mono', 0.0) - t0:8.3f}s {e.get('node', '?'):>14} {e.get('kind', '?'):<16} "
                         f"{json.dumps(detail, default=str)[:160]}")
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.events())

    def __repr__(self) -> str:
        return f"Timeline({os.path.basename(self.path)}, {len(self._events)} events)"
