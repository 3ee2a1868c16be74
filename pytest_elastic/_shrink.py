"""Shrinking: a failing chaos test is re-run with smaller fault schedules; the smallest
schedule that still fails the same way is reported, with a line that replays it.

A chaos schedule is data (one list of ``ScheduledFault`` per job), so a smaller one is
just another list handed to ``Cluster`` through ``ChaosConfig.schedules``. The search is
deterministic (the same outcomes give the same candidates) and bounded twice: by a budget
of re-runs (``--elastic-shrink-budget``), and in time, the re-runs together taking at most
``TIME_FACTOR`` times the failing run or ``MIN_SHRINK_SECONDS``, whichever is more (each
re-run's timeout is what is left of that, at most the test's own; a re-run cut short fails
differently, so it is not kept):

0. free: faults that had not fired when the test failed are dropped without a re-run;
1. drop: with two or more faults, the empty schedule first (does it fail without chaos?),
   then each fault on its own, last to first; a candidate is kept when it still fails;
2. later: each remaining timed fault fires twice as late; kept when it still fails.

A fault chained ``after_previous`` belongs to the one before it (chaos heals each
partition so): it is kept while that one is, even if it had not fired yet, and dropped
with it, never alone. A partition without its heal would turn the bug being shrunk into
a job that waits for its timeout, and a replay line with it into one that hangs.

"Still fails" means the same phase fails with the same signature (exception type and the
file:line it was raised at, as hypothesis compares failures), so a shrink never slips from
the bug it was given to a different one. Each re-run is a full pytest run of the item
(``runtestprotocol``, fresh function fixtures, as pytest-rerunfailures re-runs); only the
first run's reports are logged, with the result added as a report section.

Loaded only when a chaos test runs (imports the harness lazily, for conversions).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

from pytest_elastic._replay import Schedules, reproduction_line, schedules_from_json, schedules_to_json
from pytest_elastic._settings import RECORD_KEY, SCHEDULE_OVERRIDE_KEY, ElasticRecord, Settings
from pytest_elastic._timeout import rearmed

# schedules_to_json / schedules_from_json: the replay format's, from ``_replay`` (used here)
__all__ = ["run_with_shrinking", "shrink", "Outcome", "ShrinkResult", "schedules_to_json",
           "schedules_from_json", "signature"]

SECTION = "elastic chaos: minimal failing schedule"
#: the re-runs of a shrink together take at most this many times the failing run
TIME_FACTOR = 3.0
#: ... or this many seconds, whichever is more: a test of two seconds had 6 s for its
#: re-runs, and on a loaded machine four of them took 6.4 s and the shrink stopped short
MIN_SHRINK_SECONDS = 30.0
_TIMEOUT_MESSAGE = "Timeout (>"  # pytest-timeout's failure message starts so


# -- one run's outcome --------------------------------------------------------------------


@dataclass
class Outcome:
    """What one run of the test showed: the failing report's signature (None: passed)
    and, per job, the schedule it ran and which of its entries had fired by the failure."""

    signature: tuple[Any, ...] | None
    schedules: Schedules = ()
    fired: Schedules = ()  # the entries of ``schedules`` that had fired when it failed
    report: Any = None

    @property
    def failed(self) -> bool:
        return self.signature is not None


def failing_report(reports: list[Any]) -> Any:
    """The first failed report of a run (setup failures do not count: nothing ran)."""
    for report in reports:
        if report.failed and report.when in ("call", "teardown"):
            return report
    return None


def signature(report: Any) -> tuple[Any, ...]:
    """(phase, exception type, file, line) of a failure; (phase, first words) when the
    failure has no traceback (e.g. a scenario's expectation text)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        kind = crash.message.split("\n", 1)[0].split(":", 1)[0].strip()
        return (report.when, kind, str(crash.path), crash.lineno)
    text = str(report.longrepr).strip().split("\n", 1)[0]
    return (report.when, text.split(":", 1)[0])


def _describe_signature(sig: tuple[Any, ...]) -> str:
    if len(sig) == 4:
        return f"{sig[1]} at {sig[2]}:{sig[3]} ({sig[0]})"
    return f"{sig[1]!r} ({sig[0]})"


def outcome_of(reports: list[Any], record: ElasticRecord | None) -> Outcome:
    report = failing_report(reports)
    if record is None or record.chaos_seed is None:
        return Outcome(signature(report) if report is not None else None, report=report)
    schedules = tuple(tuple(job.chaos_schedule) for job in record.cluster.jobs)
    pending = record.pending_ids.get(report.when if report is not None else "teardown", set())
    fired = tuple(tuple(e for e in job if id(e) not in pending) for job in schedules)
    return Outcome(signature(report) if report is not None else None, schedules, fired, report)


# -- the search ---------------------------------------------------------------------------


@dataclass
class Step:
    action: str
    result: str  # "fails: kept", "passes", "fails differently: ..."


@dataclass
class ShrinkResult:
    original: Schedules
    minimal: Schedules
    runs: int
    budget: int
    signature: tuple[Any, ...]
    steps: list[Step] = field(default_factory=list)
    exhausted: bool = False
    seconds: float = 0.0
    #: the re-runs' time budget (s; None: none) and whether it ran out
    time_budget: float | None = None
    out_of_time: bool = False

    @property
    def original_count(self) -> int:
        return sum(len(job) for job in self.original)

    @property
    def minimal_count(self) -> int:
        return sum(len(job) for job in self.minimal)


def _count(schedules: Schedules) -> int:
    return sum(len(job) for job in schedules)


def _without(schedules: Schedules, unit: tuple[Any, ...]) -> Schedules:
    gone = {id(entry) for entry in unit}
    return tuple(tuple(e for e in entries if id(e) not in gone) for entries in schedules)


def _units(entries: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """One job's entries in units: an entry and the ``after_previous`` ones chained to it."""
    units: list[tuple[Any, ...]] = []
    for entry in entries:
        if getattr(entry, "after_previous", False) and units:
            units[-1] += (entry,)
        else:
            units.append((entry,))
    return units


def _all_units(schedules: Schedules) -> list[tuple[Any, ...]]:
    return [unit for entries in schedules for unit in _units(entries)]


def _fired_units(schedules: Schedules, fired: Schedules) -> Schedules:
    """The units of ``schedules`` whose first entry fired, whole: a partition that fired
    keeps its heal even if the failure came before the heal did."""
    fired_ids = {id(entry) for entries in fired for entry in entries}
    return tuple(tuple(entry for unit in _units(entries) if id(unit[0]) in fired_ids for entry in unit)
                 for entries in schedules)


def _with(schedules: Schedules, job: int, index: int, entry: Any) -> Schedules:
    return tuple(tuple(entry if (j == job and i == index) else e for i, e in enumerate(entries))
                 for j, entries in enumerate(schedules))


def _later(entry: Any) -> Any | None:
    """The same fault, twice as late (timed triggers only); None when it has no delay."""
    seconds = getattr(entry.trigger, "seconds", None)
    if seconds is None:
        return None
    later = round(seconds * 2, 3) if seconds > 0 else 0.1
    return replace(entry, trigger=replace(entry.trigger, seconds=later))


def _label(job: int, entry: Any) -> str:
    return f"job {job}: {entry.describe()}"


def shrink(first: Outcome, run: Callable[[Schedules, float | None], Outcome], budget: int,
           clock: Callable[[], float] = time.monotonic, time_budget: float | None = None) -> ShrinkResult:
    """Shrink ``first`` (a failing outcome) by calling ``run(candidate, seconds_left)`` at
    most ``budget`` times, and none once ``time_budget`` seconds have gone by; ``run`` is the
    test re-run with that schedule within the seconds left (a fake in unit tests)."""
    assert first.signature is not None  # first.failed, spelled so that the type narrows
    started = clock()
    result = ShrinkResult(first.schedules, _fired_units(first.schedules, first.fired), 0, budget,
                          first.signature, time_budget=time_budget)
    unfired = _count(first.schedules) - _count(result.minimal)
    if unfired:
        result.steps.append(Step(f"drop {unfired} fault(s) not yet fired when the test failed",
                                 "free (no re-run)"))

    def attempt(candidate: Schedules, action: str) -> bool:
        if result.runs >= budget:
            result.exhausted = True
            return False
        left = None if time_budget is None else time_budget - (clock() - started)
        if left is not None and left <= 0:
            result.exhausted = result.out_of_time = True
            return False
        result.runs += 1
        outcome = run(candidate, left)
        if outcome.signature == first.signature:
            # keep what fired; what never fired before the failure cannot be needed
            result.minimal = (_fired_units(outcome.schedules, outcome.fired) if outcome.schedules
                              else candidate)
            result.steps.append(Step(action, "still fails: kept"))
            return True
        if outcome.signature is not None:  # failed
            result.steps.append(Step(action, f"fails differently ({_describe_signature(outcome.signature)}): "
                                             "not kept"))
        else:
            result.steps.append(Step(action, "passes: not kept"))
        return False

    # 1. drop faults: all at once first, then one at a time from the last
    if _count(result.minimal) >= 2:
        attempt(tuple(() for _ in result.minimal), "drop every fault")
    for unit in reversed(_all_units(result.minimal)):
        where = _find(result.minimal, unit[0])  # a kept candidate may have dropped it already
        if where is not None:
            chained = f" with {len(unit) - 1} chained after it" if len(unit) > 1 else ""
            attempt(_without(result.minimal, unit), f"drop {_label(where[0], unit[0])}{chained}")
    # 2. move the remaining faults later, one at a time (a chained one moves with its head)
    for entry in [unit[0] for unit in _all_units(result.minimal)]:
        where, later = _find(result.minimal, entry), _later(entry)
        if where is not None and later is not None:
            attempt(_with(result.minimal, *where, later),
                    f"move later: {_label(where[0], entry)} -> {later.trigger.seconds:g}s")
    result.seconds = clock() - started
    return result


def _find(schedules: Schedules, entry: Any) -> tuple[int, int] | None:
    """Where ``entry`` (this very object) is in ``schedules``."""
    for job, entries in enumerate(schedules):
        for index, candidate in enumerate(entries):
            if candidate is entry:
                return job, index
    return None


# -- the protocol -------------------------------------------------------------------------


def wants_shrinking(item: pytest.Item, settings: Settings) -> bool:
    return (settings.chaos and settings.shrink_budget > 0
            and item.get_closest_marker("elastic") is not None
            and not item.config.getoption("usepdb", False))


def run_with_shrinking(item: pytest.Item, nextitem: pytest.Item | None, settings: Settings) -> bool:
    """``pytest_runtest_protocol`` for a chaos test: run it; if it failed, shrink its
    schedule with re-runs, then log the first run's reports (with the result section)."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    began = time.monotonic()
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    took = time.monotonic() - began
    record = item.stash.get(RECORD_KEY, None)
    first = outcome_of(reports, record)
    if first.failed and record is not None and record.chaos_seed is not None:
        if _TIMEOUT_MESSAGE in str(first.report.longrepr):
            first.report.sections.append((SECTION, "not shrunk: the test timed out (each re-run "
                                                   "would cost a whole timeout)"))
        elif not _count(first.schedules):
            pass  # nothing to shrink: the chaos section already says the schedule was empty
        else:
            saved = list(item.user_properties)

            def run(candidate: Schedules, seconds_left: float | None) -> Outcome:
                item.stash[SCHEDULE_OVERRIDE_KEY] = candidate  # read by the re-run's cluster
                try:
                    with rearmed(item, limit=seconds_left):
                        rerun = runtestprotocol(item, nextitem=nextitem, log=False)
                finally:
                    del item.stash[SCHEDULE_OVERRIDE_KEY]
                return outcome_of(rerun, item.stash.get(RECORD_KEY, None))

            try:
                result = shrink(first, run, settings.shrink_budget,
                                time_budget=max(TIME_FACTOR * took, MIN_SHRINK_SECONDS))
            finally:
                item.user_properties[:] = saved
                item.stash[RECORD_KEY] = record  # the first run's: its reports are the ones logged
            first.report.sections.append((SECTION, describe(result, item.nodeid, settings)))
            replay = schedules_to_json(result.minimal)
            teardown = reports[-1]
            teardown.user_properties.append(("elastic_minimal_faults", result.minimal_count))
            if replay is not None:
                teardown.user_properties.append(("elastic_minimal_schedule", replay))
    for report in reports:
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def describe(result: ShrinkResult, test_id: str, settings: Settings) -> str:
    lines = [f"shrunk {result.original_count} fault(s) to {result.minimal_count} in {result.runs} "
             f"re-run(s) (budget {result.budget}, {result.seconds:.1f}s); same failure throughout: "
             f"{_describe_signature(result.signature)}"]
    if result.out_of_time and result.time_budget is not None:
        lines.append(f"the time ran out ({result.time_budget:.1f}s: {TIME_FACTOR:g}x the failing run, at least "
                     f"{MIN_SHRINK_SECONDS:g}s): a smaller schedule may exist (replay the minimal one below and "
                     "shrink again)")
    elif result.exhausted:
        lines.append("the budget ran out: a smaller schedule may exist (--elastic-shrink-budget=N)")
    lines.append("minimal failing schedule:")
    if result.minimal_count:
        lines += [f"  {_label(j, e)}" for j, job in enumerate(result.minimal) for e in job]
    else:
        lines.append("  (none: the test fails without any fault, so chaos is not the cause)")
    lines.append("shrink steps:")
    lines += [f"  {step.action}: {step.result}" for step in result.steps] or ["  (none)"]
    replay = schedules_to_json(result.minimal)
    if replay is not None:
        lines += ["replay exactly this schedule (no shrinking) with:",
                  f"  {reproduction_line(test_id, settings, replay, shrink_budget=0)}"]
    return "\n".join(lines)
