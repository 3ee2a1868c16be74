"""Fires a job's scheduled faults when their triggers are met (one thread per job)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.sim.faults import ScheduledFault

if TYPE_CHECKING:
    from harness.sim.job import Job

__all__ = ["FaultScheduler"]


@dataclass(eq=False)
class _Pending:
    """A scheduled fault not fired yet; ``armed_at`` None: waiting for its predecessor."""

    entry: ScheduledFault
    armed_at: float | None
    successor: "_Pending | None" = None
    fired: bool = False


class FaultScheduler:
    """Fires scheduled faults when their triggers are met (one thread per job)."""

    def __init__(self, job: Job):
        self._job = job
        self._entries: list[_Pending] = []
        self._last: _Pending | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"faults-{job.run_id}", daemon=True)
        self._thread.start()

    def add(self, entry: ScheduledFault) -> None:
        with self._lock:
            pending = _Pending(entry, time.monotonic())
            previous = self._last
            if entry.after_previous and previous is not None and not previous.fired:
                pending.armed_at = None  # armed when ``previous`` fires
                previous.successor = pending
            self._last = pending
            self._entries.append(pending)

    def pending(self) -> list[ScheduledFault]:
        with self._lock:
            return [p.entry for p in self._entries]

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            now = time.monotonic()
            with self._lock:
                due = [p for p in self._entries
                       if p.armed_at is not None and p.entry.trigger.ready(self._job, p.armed_at, now)]
                for p in due:
                    self._entries.remove(p)
                    p.fired = True
                    if p.successor is not None:
                        p.successor.armed_at = now
            for p in due:
                try:
                    p.entry.fault.apply(self._job)
                except Exception as e:  # a fault that cannot fire is reported, not fatal
                    self.errors.append(f"{p.entry.describe()}: {e}")
                    self._job._harness_events.emit("fault_error", description=p.entry.describe(),
                                                   error=str(e))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


