"""A lasting fault chaos put in place ends with the job, never after it: its heal comes by
its own trigger or as soon as the job's training is over, and the job's end fires any
still armed (``FaultScheduler.adopt_chaos``, ``fire_at_end``).

A bare stand-in job (a real event file, timeline and bus; no processes) whose ``heal``
records what it was asked, so each step happens when the test says so.
"""

from __future__ import annotations

import time
from typing import Any

from harness.events import EventWriter
from harness.sim.bus import EventBus
from harness.sim.faults import After, Fault, Heal, Immediately, ScheduledFault
from harness.sim.faults.scheduler import FaultScheduler
from harness.sim.truth.hangs import training_over
from harness.sim.truth.timeline import Timeline


class _Lasting(Fault):
    """A lasting fault that only records itself."""

    kind = "lasting_for_test"

    def apply(self, job: Any) -> None:
        job.record("fault", fault="slow_node", target_node=1)

    def describe(self) -> str:
        return "_Lasting()"


class _BareJob:
    """What the scheduler asks of a job, plus a ``heal`` that records its call."""

    def __init__(self, directory: str):
        self.run_id = "bare"
        self.events_path = f"{directory}/events.jsonl"
        self.timeline = Timeline(self.events_path)
        self.bus = EventBus(self.timeline, directory)
        self.harness_events = EventWriter(self.events_path, "harness", self.run_id, self.bus.wake_path)
        self.agent_events = EventWriter(self.events_path, 0, self.run_id, self.bus.wake_path)
        self.scheduler = FaultScheduler(self)
        self.heals: list[tuple[int | None, bool]] = []

    def record(self, event: str, **fields: Any) -> None:
        with self.scheduler.recording() as origin:
            self.harness_events.emit(event, **fields, **origin)

    def heal(self, node: int | None = None, at_end: bool = False) -> None:
        self.heals.append((node, at_end))
        self.record("heal", target_node=node, healed=["slow_node"], **({"at_end": True} if at_end else {}))

    def close(self) -> None:
        self.scheduler.stop()
        self.harness_events.close()
        self.agent_events.close()
        self.bus.close()


def _chaos(job: _BareJob, heal_after: float = 600.0) -> list[ScheduledFault]:
    """A chaos-like pair: a lasting fault now, its node's heal ``heal_after`` s after it."""
    schedule = [ScheduledFault(_Lasting(), Immediately()),
                ScheduledFault(Heal(node=1), After(seconds=heal_after), after_previous=True)]
    job.scheduler.adopt_chaos(schedule)  # first: the fault fires at once
    for entry in schedule:
        job.scheduler.add(entry)
    return schedule


def _until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_the_heal_comes_as_soon_as_the_training_is_over(tmp_path):
    job = _BareJob(str(tmp_path))
    try:
        _chaos(job)
        assert _until(lambda: len(job.scheduler.pending()) == 1)  # the fault fired; its heal waits 600 s
        assert job.heals == []
        job.agent_events.emit("state", state="SUCCEEDED")  # node 0's workers all succeeded
        assert _until(lambda: job.heals == [(1, True)])
        assert job.scheduler.pending() == []
        heal = job.timeline.events("heal")[-1]
        assert heal["at_end"] is True and training_over(job.timeline) is not None
        assert heal["chaos"] is True and job.timeline.events("fault")[-1]["chaos"] is True  # chaos's, and says so
    finally:
        job.close()


def test_the_end_of_the_job_fires_an_armed_heal_still_pending(tmp_path):
    """A job that failed (no success, so no training over): its end heals what chaos left."""
    job = _BareJob(str(tmp_path))
    try:
        _chaos(job)
        assert _until(lambda: len(job.scheduler.pending()) == 1)
        job.scheduler.fire_at_end()
        assert job.heals == [(1, True)] and job.scheduler.pending() == []
        assert job.timeline.events("heal")[-1]["chaos"] is True  # healed in this thread, still chaos's
        job.scheduler.fire_at_end()  # once only
        assert job.heals == [(1, True)]
    finally:
        job.close()


def test_a_heal_whose_fault_never_fired_is_not_fired_at_the_end(tmp_path):
    job = _BareJob(str(tmp_path))
    try:
        never = ScheduledFault(_Lasting(), After(seconds=600))
        heal = ScheduledFault(Heal(node=1), After(seconds=1), after_previous=True)
        job.scheduler.adopt_chaos([never, heal])
        for entry in (never, heal):
            job.scheduler.add(entry)
        job.scheduler.fire_at_end()
        assert job.heals == [] and len(job.scheduler.pending()) == 2
    finally:
        job.close()


def test_a_heal_of_the_tests_own_is_left_to_its_trigger(tmp_path):
    """Only chaos's heals end with the job: one the test scheduled itself waits for its trigger."""
    job = _BareJob(str(tmp_path))
    try:
        for entry in (ScheduledFault(_Lasting(), Immediately()),
                      ScheduledFault(Heal(node=1), After(seconds=600), after_previous=True)):
            job.scheduler.add(entry)
        assert _until(lambda: len(job.scheduler.pending()) == 1)
        job.agent_events.emit("state", state="SUCCEEDED")
        job.scheduler.fire_at_end()
        time.sleep(0.2)
        assert job.heals == [] and len(job.scheduler.pending()) == 1
        assert "chaos" not in job.timeline.events("fault")[-1]
    finally:
        job.close()


def test_training_over_is_the_first_success_or_clean_worker_exit(tmp_path):
    path = tmp_path / "events.jsonl"
    timeline = Timeline(str(path))
    writer = EventWriter(str(path), 0, "run")
    try:
        writer.emit("state", state="HEALTHY")
        writer.emit("worker_exit", exitcode=1)
        assert training_over(timeline) is None
        writer.emit("worker_exit", exitcode=0)
        first = training_over(timeline)
        assert first is not None
        writer.emit("state", state="SUCCEEDED")
        assert training_over(timeline) == first
    finally:
        writer.close()



def test_no_chaos_fault_fires_once_the_training_is_over(tmp_path):
    """A chaos straggler due as a single-node job ended reached an agent that had left its
    cgroup, and failed the test (forgets_optimizer_is_caught under every kind): once the
    training is over, chaos's faults stay pending; the test's own still fire."""
    job = _BareJob(str(tmp_path))
    try:
        late = ScheduledFault(_Lasting(), After(seconds=0.2))
        own = ScheduledFault(_Lasting(), After(seconds=0.2))
        job.scheduler.adopt_chaos([late])
        job.agent_events.emit("state", state="SUCCEEDED")
        job.scheduler.add(late)
        job.scheduler.add(own)
        assert _until(lambda: [id(e) for e in job.scheduler.pending()] == [id(late)])  # the test's own fired
        time.sleep(0.4)
        assert [id(e) for e in job.scheduler.pending()] == [id(late)] and len(job.timeline.events("fault")) == 1
    finally:
        job.close()
