"""What the scheduler offers the storage part for ``OnFile``: a file operation that meets a
trigger is held until the fault it fires has been applied (so a kill lands between two steps
of a save). The held request sleeps on the scheduler's condition (``await_applied``), woken
as the fault settles, never on a polling tick; and it is never released while the fault is
still being applied, even though the fault counts as fired from its event on.

A bare stand-in job (a real event file, timeline and bus; no processes) and a trigger and
fault of the test's own make each step happen when the test says so.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from harness.events import EventWriter
from harness.sim.bus import EventBus
from harness.sim.faults import Fault, ScheduledFault, Trigger
from harness.sim.faults.scheduler import FaultScheduler
from harness.sim.truth.timeline import Timeline


@dataclass(frozen=True, eq=False)
class _Gate(Trigger):
    """Met once the test opens it (a watched file appeared)."""

    opened: threading.Event = field(default_factory=threading.Event)

    def ready(self, job: Any, armed_at: float, now: float) -> bool:
        return self.opened.is_set()


@dataclass(frozen=True, eq=False)
class _Slow(Fault):
    """Records its event (it counts as fired from then on), then acts only once released."""

    applying: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    acted: list[str] = field(default_factory=list)

    def apply(self, job: Any) -> None:
        job.record("fault", fault="slow")
        self.applying.set()
        assert self.release.wait(30), "the test never released the fault"
        self.acted.append("acted")

    def describe(self) -> str:
        return "_Slow()"  # its events are no fields to print


class _BareJob:
    """What the scheduler asks of a job: its bus, run id, event writer, and ``record``."""

    def __init__(self, directory: str):
        self.run_id = "bare"
        self.timeline = Timeline(f"{directory}/events.jsonl")
        self.bus = EventBus(self.timeline, directory)
        self.harness_events = EventWriter(f"{directory}/events.jsonl", "harness", self.run_id, self.bus.wake_path)
        self.scheduler = FaultScheduler(self)

    def record(self, event: str, **fields: Any) -> None:
        with self.scheduler.recording():
            self.harness_events.emit(event, **fields)

    def close(self) -> None:
        self.scheduler.stop()
        self.harness_events.close()
        self.bus.close()


def _hold(job: _BareJob, gate: _Gate, answers: list[bool]) -> threading.Thread:
    """A held file operation, as the storage part's request thread holds it."""
    thread = threading.Thread(target=lambda: answers.append(job.scheduler.await_applied(gate, 60)))
    thread.start()
    return thread


def test_a_held_operation_goes_on_only_once_its_fault_was_applied(tmp_path):
    job = _BareJob(str(tmp_path))
    gate, fault = _Gate(), _Slow()
    answers: list[bool] = []
    try:
        job.scheduler.add(ScheduledFault(fault, gate))
        assert job.scheduler.fault_in_flight(gate)  # pending
        gate.opened.set()
        holder = _hold(job, gate, answers)
        assert fault.applying.wait(30)
        assert not job.scheduler.pending()  # fired: its event is written ...
        assert job.scheduler.fault_in_flight(gate)  # ... but it has not acted yet
        holder.join(0.2)
        assert holder.is_alive() and answers == []  # so the operation is still held
        fault.release.set()
        holder.join(30)
        assert answers == [True] and fault.acted == ["acted"]
        assert not job.scheduler.fault_in_flight(gate)
    finally:
        fault.release.set()
        job.close()


def test_a_held_operation_is_let_go_when_the_scheduler_stops(tmp_path):
    """The job's end releases every held operation at once, its fault never applied."""
    job = _BareJob(str(tmp_path))
    gate = _Gate()  # never opened: its fault stays pending
    answers: list[bool] = []
    try:
        job.scheduler.add(ScheduledFault(_Slow(), gate))
        holder = _hold(job, gate, answers)
        job.scheduler.stop()
        holder.join(30)
        assert not holder.is_alive() and answers == [False]
    finally:
        job.close()


def test_an_operation_no_fault_waits_for_is_not_held(tmp_path):
    job = _BareJob(str(tmp_path))
    try:
        assert job.scheduler.await_applied(_Gate(), 60) is True  # no thread was ever started
    finally:
        job.close()
