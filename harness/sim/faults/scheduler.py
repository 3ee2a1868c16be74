"""Fires a job's scheduled faults when their triggers are met (one thread per job).

The thread sleeps on the job's event bus: it re-evaluates the triggers whenever new events
arrive (``OnState``, ``AtStep``, ``OnWorldSize``...) and at the next time a time-based
trigger (``After``, ``AfterHealthy``) comes due, never on a polling tick.

A fault is *fired* the moment the job records it (its ``fault`` event, written inside
``recording()``, under the lock ``pending()`` takes: no one sees the event of a fault still
pending, nor a fault gone from pending whose event is not written yet), or once its
``apply`` returned, whichever comes first. One whose target is not there yet (a
worker between two rounds: ``TargetNotReady``) stays pending and is retried on the next
event. Any other error while evaluating or applying it is a *failure*: the entry leaves
the schedule unfired, a ``fault_error`` event records it, and the job's waits raise
``FaultError`` with the reason.

Once the job's training is over, no chaos fault fires any more (one that reached a node whose
agent was ending failed the test for a race of the harness's own: ``slow_node`` finding the
agent gone from its cgroup); it stays pending, as any chaos fault the job ended before.
Chaos ends the job with its lasting faults healed: each chaos ``heal`` (``adopt_chaos``)
comes due by its own trigger or as soon as the job's training is over
(``harness.sim.truth.hangs.training_over``), whichever comes first, and ``fire_at_end``
fires the armed ones still pending when the job has ended (a job that failed, or was never
waited for). Its ``heal`` event then says ``at_end``: the fault lasted until the job's end,
not longer, and nothing chaos put in place is left for the test to answer for.

``schedule`` arms a list of entries, each checked against what the job can ever have
(``check_targets``) before any is armed; an exact (rank, step) crash is no entry here but an
order the worker obeys itself (``ProcessFaults.order_exit_at``). The thread starts with the
first entry: a job without scheduled faults has none.

A fault triggered by a file operation (``OnFile``) holds that operation inside the job's
filesystem until the fault is applied, so a kill lands between two steps of a save: the
storage part asks ``await_applied``, which sleeps on a condition the scheduler notifies as
each entry fires, fails or is done being applied (``fault_in_flight`` asks the same once,
without waiting).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.sim.bus import SAFETY_S
from harness.sim.errors import FaultError, FaultNotFired, TargetNotReady
from harness.sim.faults.data import AtStep, Heal, JobShape, NodeAdd, ScheduledFault, Trigger, WorkerKill, check_targets
from harness.sim.truth.hangs import training_over

if TYPE_CHECKING:
    from harness.sim.faults.target import ScheduledJob

__all__ = ["FaultScheduler", "FaultError", "FaultNotFired", "TargetNotReady"]


@dataclass(eq=False)
class _Pending:
    """A scheduled fault not fired yet; ``armed_at`` None: waiting for its predecessor."""

    entry: ScheduledFault
    armed_at: float | None
    successor: _Pending | None = None
    fired: bool = False
    #: why its target could not take it, the last time its trigger was met (TargetNotReady)
    blocked: str | None = None


class FaultScheduler:
    """Fires scheduled faults when their triggers are met (one thread per job, from its
    first entry on)."""

    def __init__(self, job: ScheduledJob):
        self._job = job
        self._entries: list[_Pending] = []
        self._last: _Pending | None = None
        self._lock = threading.Lock()
        #: notified (under ``_lock``) whenever an entry fires, fails or is done being applied
        self._settled = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._failures: list[tuple[_Pending, str]] = []
        self._applying: _Pending | None = None  # the entry this thread is applying now
        self._joins = 0  # node joins scheduled: each makes one more node index valid
        self._thread: threading.Thread | None = None
        #: ids of chaos's entries (``adopt_chaos``): their events say ``chaos``
        self._chaos: set[int] = set()
        #: ids of chaos's heals: they come due when the job's training is over too
        self._at_end: set[int] = set()
        self._ending: _Pending | None = None  # the heal ``fire_at_end`` applies in the caller's thread
        self._over = False  # the job's training is over (``training_over``; once over, for good)

    def adopt_chaos(self, entries: list[ScheduledFault]) -> None:
        """``entries`` are chaos's (adopted before they are scheduled): each one's event says ``chaos: true``
        (a scenario's expectations tell its own faults from chaos's by it), and each ``Heal``
        comes due when the job's training is over as well as by its own trigger, and fires at
        ``fire_at_end`` if still armed: a fault chaos put in place lasts until its heal or the
        job's end, never past it."""
        with self._lock:
            self._chaos.update(id(entry) for entry in entries)
            self._at_end.update(id(entry) for entry in entries if isinstance(entry.fault, Heal))

    def fire_at_end(self) -> None:
        """The job has ended (or is being closed): fire, in the caller's thread, every armed
        entry of ``adopt_chaos`` still pending (its fault fired; its heal had not come)."""
        with self._settled:
            self._settled.wait_for(lambda: self._applying is None or id(self._applying.entry) not in self._at_end,
                                   SAFETY_S)
            due = [p for p in self._entries if p.armed_at is not None and id(p.entry) in self._at_end]
            for p in due:
                p.armed_at = None  # claimed here: the thread passes it over
        for p in due:
            self._heal_at_end(p)

    def _heal_at_end(self, p: _Pending) -> None:
        """Apply the chaos heal ``p`` because the job ends, then mark it fired."""
        fault = p.entry.fault
        assert isinstance(fault, Heal)
        self._ending = p if threading.current_thread() is not self._thread else None
        try:
            self._job.heal(fault.node, at_end=True)
        except Exception as e:  # recorded and raised by the job's waits, never dropped
            self._fail(p, e)
            return
        finally:
            self._ending = None
        self._fired(p)

    def schedule(self, entries: list[ScheduledFault]) -> None:
        """Arm ``entries``: all of them, or (``ConfigError``, naming the first that names a
        node, local rank or rank the job can never have, or that its node's host cannot
        carry out: ``FaultRefused``) none."""
        self._job.place.refuse(entries)  # what the nodes' place cannot carry out, first
        joins = self._joins
        for entry in entries:
            joins += isinstance(entry.fault, NodeAdd)
            check_targets(entry, self._shape(joins))
        self._joins = joins
        for entry in entries:
            crash = entry.fault
            if isinstance(crash, WorkerKill) and crash.exit_code is not None and isinstance(entry.trigger, AtStep):
                # exact (rank, step) crashes are left as orders the worker obeys itself
                self._job.processes.order_exit_at(entry.trigger.rank, entry.trigger.step, crash.exit_code,
                                                  entry.describe())
                continue
            self.add(entry)

    def _shape(self, joins: int) -> JobShape:
        """What a fault may target: the job's nodes (its maximum, or more if it grew, plus
        ``joins`` scheduled), local ranks and ranks."""
        settings = self._job.cluster.config
        return JobShape(nodes=max(settings.max_nodes, len(self._job.nodes)) + joins,
                        nproc_per_node=settings.nproc_per_node,
                        world=settings.max_nodes * settings.nproc_per_node,
                        nnodes=f"{settings.min_nodes}:{settings.max_nodes}")

    def add(self, entry: ScheduledFault) -> None:
        """Arm one entry, unchecked (``schedule`` checks); the thread starts with the first."""
        with self._lock:
            pending = _Pending(entry, time.monotonic())
            previous = self._last
            if entry.after_previous and previous is not None and not previous.fired:
                pending.armed_at = None  # armed when ``previous`` fires
                previous.successor = pending
            self._last = pending
            self._entries.append(pending)
            thread = None
            if self._thread is None and not self._stop.is_set():
                thread = self._thread = threading.Thread(target=self._run, name=f"faults-{self._job.run_id}",
                                                         daemon=True)
        if thread is not None:
            thread.start()
        self._job.bus.notify()  # evaluate it now (an ``Immediately`` fires at once)

    def pending(self) -> list[ScheduledFault]:
        """Entries neither fired nor failed yet."""
        with self._lock:
            return [p.entry for p in self._entries]

    def failures(self) -> list[tuple[ScheduledFault, str]]:
        """(entry, reason) of every entry that could not be applied."""
        with self._lock:
            return [(p.entry, reason) for p, reason in self._failures]

    def never_fired(self) -> list[tuple[ScheduledFault, str]]:
        """(entry, why) of every entry still pending: its trigger's reason, or that its
        predecessor never fired, or what kept its target from taking it."""
        with self._lock:
            entries = list(self._entries)
        reasons = []
        now = time.monotonic()
        for p in entries:
            if p.armed_at is None:
                why = "it was never armed: the fault before it never fired"
            elif p.blocked is not None:
                why = f"its trigger was met but its target never could take it ({p.blocked})"
            elif p.entry.trigger.ready(self._job, p.armed_at, now):
                why = "its trigger was met only as the job ended, too late to act on"
            else:
                why = p.entry.trigger.never_met(self._job, p.armed_at)
            reasons.append((p.entry, why))
        return reasons

    def next_due(self) -> float | None:
        """The earliest monotonic time an armed entry comes due by time alone (None: none
        does): the job is waiting for the harness until then, not stalled."""
        with self._lock:
            armed = [(p.entry.trigger, p.armed_at) for p in self._entries if p.armed_at is not None]
        times = []
        for trigger, armed_at in armed:
            assert armed_at is not None
            try:
                at = trigger.deadline(self._job, armed_at)
            except Exception:  # a trigger that cannot say is the fault thread's to report
                continue
            if at is not None:
                times.append(at)
        return min(times, default=None)

    def unfired(self) -> list[ScheduledFault]:
        """Entries pending, then those that failed before they fired."""
        with self._lock:
            return [p.entry for p in self._entries] + [p.entry for p, _ in self._failures if not p.fired]

    def fault_in_flight(self, trigger: Trigger) -> bool:
        """Whether the fault ``trigger`` fires is pending, or being applied now (a fault is
        marked fired when its event is written, before its ``apply`` has acted)."""
        with self._lock:
            return self._in_flight(trigger)

    def await_applied(self, trigger: object, timeout: float) -> bool:
        """The caller has just met ``trigger`` (a file operation the filesystem holds): wake
        the thread to evaluate it now, and sleep until its fault is no longer in flight
        (applied, failed, or none: ``fault_in_flight``), at most ``timeout`` s, or until
        the scheduler stops; whether it settled."""
        self._job.bus.notify()
        with self._settled:
            self._settled.wait_for(lambda: self._stop.is_set() or not self._in_flight(trigger), timeout)
            return not self._in_flight(trigger)

    def _in_flight(self, trigger: object) -> bool:
        """``fault_in_flight``, under ``_lock``."""
        applying = self._applying
        return (any(p.entry.trigger is trigger for p in self._entries)
                or (applying is not None and applying.entry.trigger is trigger))

    def _run(self) -> None:
        bus = self._job.bus
        listening = False  # the bus wakes on every event only while faults are pending
        try:
            while not self._stop.is_set():
                with self._lock:
                    pending = bool(self._entries)
                if pending and not listening:
                    bus.subscribe()
                elif listening and not pending:
                    bus.unsubscribe()
                listening = pending
                seen = bus.generation  # before evaluating: nothing that happens during it is missed
                next_at = self._fire_due()
                timeout = SAFETY_S if next_at is None else min(SAFETY_S, next_at - time.monotonic())
                if timeout > 0:
                    bus.wait_change(seen, timeout)
        finally:
            if listening:
                bus.unsubscribe()

    def _fire_due(self) -> float | None:
        """Apply every entry whose trigger is met; the earliest time a time-based trigger
        of the others comes due (None: only events can make one due)."""
        now = time.monotonic()
        due: list[_Pending] = []
        ending: set[int] = set()  # ids of the heals due because the job's training is over
        next_at: float | None = None
        with self._lock:
            armed = [p for p in self._entries if p.armed_at is not None]
        chaotic = any(id(p.entry) in self._chaos for p in armed)
        over = chaotic and self._training_over()
        for p in armed:
            armed_at = p.armed_at
            if armed_at is None:  # claimed by ``fire_at_end`` meanwhile
                continue
            heal_at_end = id(p.entry) in self._at_end
            if over and id(p.entry) in self._chaos and not heal_at_end:
                continue  # the job is ending: a new chaos fault would only race its end (never fired)
            try:
                if p.entry.trigger.ready(self._job, armed_at, now):
                    due.append(p)
                    continue
                if over and heal_at_end:
                    due.append(p)
                    ending.add(id(p))
                    continue
                at = p.entry.trigger.deadline(self._job, armed_at)
            except Exception as e:  # recorded and raised by the job's waits, never dropped
                self._fail(p, e)
                continue
            if at is not None:
                next_at = at if next_at is None else min(next_at, at)
        for p in due:
            if self._stop.is_set():
                break
            with self._lock:
                if p.armed_at is None or p not in self._entries:  # ``fire_at_end`` took it
                    continue
                self._applying = p
            if id(p) in ending:
                self._heal_at_end_here(p)
                continue
            try:
                p.entry.fault.apply(self._job)
            except TargetNotReady as e:
                p.blocked = str(e)
                continue  # still pending: retried when the next event arrives
            except Exception as e:  # recorded and raised by the job's waits, never dropped
                self._fail(p, e)
                continue
            finally:
                with self._lock:
                    self._applying = None
                    self._settled.notify_all()  # ``await_applied``: no longer being applied
            self._fired(p)
        return next_at

    def _training_over(self) -> bool:
        """Whether the job's training is over (read from the timeline until it is, then kept)."""
        if not self._over:
            self._over = training_over(self._job.timeline) is not None
        return self._over

    def _heal_at_end_here(self, p: _Pending) -> None:
        """``_heal_at_end`` on this thread (``p`` is ``_applying``)."""
        try:
            self._heal_at_end(p)
        finally:
            with self._lock:
                self._applying = None
                self._settled.notify_all()

    @contextlib.contextmanager
    def recording(self) -> Iterator[dict[str, Any]]:
        """The job writes a fault's event inside: if this thread is applying an entry, the
        entry fires, atomically with the write as ``pending()`` sees it. Yields the fields
        the event adds (``chaos: true`` for an entry of chaos's)."""
        p = self._applying
        if p is None or threading.current_thread() is not self._thread:
            yield self._origin_of(self._ending)
            return
        with self._lock:
            self._mark_fired(p)
            yield self._origin_of(p)
        self._job.bus.notify()  # waiters on pending_faults()

    def _origin_of(self, p: _Pending | None) -> dict[str, Any]:
        return {"chaos": True} if p is not None and id(p.entry) in self._chaos else {}

    def _fired(self, p: _Pending) -> None:
        with self._lock:
            self._mark_fired(p)
        self._job.bus.notify()  # waiters on pending_faults()

    def _mark_fired(self, p: _Pending) -> None:
        """Under ``_lock``."""
        if not p.fired:
            self._entries.remove(p)
            p.fired = True
            if p.successor is not None:
                p.successor.armed_at = time.monotonic()
            self._settled.notify_all()

    def _fail(self, p: _Pending, error: Exception) -> None:
        reason = f"{type(error).__name__}: {error}"
        if p.fired:  # it acted, then failed: a failure to report, but it did fire
            reason += " (after the fault was recorded as fired)"
        with self._lock:
            if p in self._entries:
                self._entries.remove(p)
            self._failures.append((p, reason))
            self._settled.notify_all()
        self._job.harness_events.emit("fault_error", description=p.entry.describe(), error=reason)
        self._job.bus.notify(lifecycle=True)  # Job.wait raises it

    def stop(self) -> None:
        """End the thread (the job's end); ``await_applied`` returns at once from now on."""
        with self._lock:
            self._stop.set()
            self._settled.notify_all()
            thread = self._thread
        self._job.bus.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
