"""Recovery judged on the training: what a fault cost, and how much of the job was training.

The agents' view ("every node HEALTHY again") says nothing about whether training resumed; the
step events the workers report (``harness.report_step``) do. Everything here is a pure
function of the event list, so it is tested on hand-made timelines and used by ``Timeline``
and ``Job`` alike.

**What a fault cost** (``fault_cost``), the categories of Google's ML Productivity Goodput:

* ``detection``: fault -> the first agent reaction (a state change, a worker exit, a
  membership change), as ``detection_latency``;
* ``recovery``: reaction -> the workers of the first round that began after the fault have
  all started (teardown, rendezvous, spawn);
* ``startup``: those workers started -> the first training step any of them reports
  (imports, process group, checkpoint load);
* ``wasted``: the original time of the work thrown away: from the moment the old round
  reported the first step the new round redid, to the fault.

``resume_latency`` = detection + recovery + startup: fault -> training resumed. A step
"belongs" to a round through its worker's pid (``worker_start`` carries ``worker_pid``,
``round`` and ``restart_count``), so no clock has to be compared across processes to tell
an old round's late step from a new round's first.

**Goodput** (``goodput``): wall time from the first event to the last of the job's own, and
the badput that can be attributed: the initial start-up (first event -> first step), each
fault's lost time, checkpoint saves the script marked (``harness.report_checkpoint``) and the
tail (last step -> end: teardown, exit barrier). Productive time is what is left: the steps
that count. What the judges add once the job has ended (``AFTER_THE_JOB``: the twin's verdict,
a storage fault left in place at close) is not the job's time: a twin run after the job would
otherwise count as seconds of its tail.

**Step rate per rank** (``rank_rates``): steps per second of each rank, and the share of that
time its worker was runnable but not running (``cpu_wait``: the kernel's run delay, which
``report_step`` sends with each step, from ``/proc/self/schedstat``). In synchronous
training every rank steps at the pace of the slowest, so the rates alone cannot name a
straggler; the CPU wait does: a rank held to a CPU quota (``slow_node``), or crowded out by
a neighbour, waits for the CPU while the others wait in the collective, asleep.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

__all__ = ["LOST_CATEGORIES", "FaultCost", "Goodput", "RankRate", "TrainingIndex", "annotate_steps", "fault_cost",
           "goodput", "rank_rates", "rates_report", "rates_summary", "round_of", "slow_windows", "step_cpu",
           "step_times", "straggler"]

#: the keys of ``FaultRecord.lost``, always all present
LOST_CATEGORIES = ("detection", "recovery", "startup", "wasted")
#: events the harness adds after the job has ended: not part of its wall time
AFTER_THE_JOB = frozenset({"golden", "storage_unhealed"})

Event = Mapping[str, Any]


@dataclass(frozen=True)
class FaultCost:
    resume_latency: float | None  # None: training never resumed after the fault
    lost: dict[str, float]


@dataclass(frozen=True)
class Goodput:
    """How much of a job's wall time was training (``ratio`` = productive / wall)."""

    ratio: float
    productive_s: float
    wall_s: float
    badput: dict[str, float] = field(default_factory=dict)
    faults: int = 0                             # faults that cost something
    restart_cost_s: float | None = None         # mean detection + recovery + startup per fault
    checkpoint_cost_s: float | None = None      # mean marked checkpoint save
    checkpoint_interval_s: float | None = None  # mean time between checkpoint starts

    def summary(self) -> str:
        lost = sum(v for k, v in self.badput.items() if k in LOST_CATEGORIES)
        parts = [f"goodput {self.ratio:.2f}"]
        if self.faults:
            detail = ", ".join(f"{k} {self.badput.get(k, 0.0):.2f} s" for k in LOST_CATEGORIES)
            parts.append(f"lost {lost:.2f} s to {self.faults} fault{'s' if self.faults != 1 else ''}: {detail}")
        return "; ".join(parts)


def _mono(event: Event) -> float:
    return float(event.get("mono", 0.0))


def round_of(worker_start: Event) -> tuple[int, int]:
    """The (round, restart_count) a ``worker_start`` event started its worker for: what a
    step of that worker belongs to (its ``round`` and ``attempt``)."""
    return int(worker_start.get("round", -1)), int(worker_start.get("restart_count", 0))


def worker_rounds(events: Iterable[Event]) -> dict[int, tuple[int, int]]:
    """worker pid -> (round, restart_count) it was started for."""
    return {int(e["worker_pid"]): round_of(e)
            for e in events if e.get("kind") == "worker_start" and "worker_pid" in e}


def annotate_steps(steps: Iterable[dict[str, Any]], rounds: Mapping[int, tuple[int, int]]) -> None:
    """Give each step event the ``round`` and ``attempt`` of the worker that reported it."""
    for step in steps:
        found = rounds.get(int(step.get("pid", -1)))
        if found is not None:
            step["round"], step["attempt"] = found


class TrainingIndex:
    """One pass over a job's events, then each fault's cost in about O(log E): the report
    prices a hundred faults over sixty thousand events, so no per-fault scan of everything.

    A round (``(round, restart_count)`` of its ``worker_start`` events) *began after* a fault
    when its first worker started after it; its workers' pids are what makes a step "new"."""

    def __init__(self, events: Sequence[Event]):
        firsts: dict[tuple[int, int], float] = {}
        lasts: dict[tuple[int, int], float] = {}
        self._pid_round: dict[int, tuple[int, int]] = {}
        for e in events:
            if e.get("kind") == "worker_start" and "worker_pid" in e:
                key = round_of(e)
                t = _mono(e)
                firsts[key] = min(t, firsts.get(key, t))
                lasts[key] = max(t, lasts.get(key, t))
                self._pid_round[int(e["worker_pid"])] = key
        self._rounds = sorted(firsts, key=lambda k: firsts[k])
        self._round_firsts = [firsts[k] for k in self._rounds]
        self._round_lasts = lasts
        self._steps = [e for e in events if e.get("kind") == "step"]
        self._step_times = [_mono(e) for e in self._steps]

    def cost(self, fault: Event, detection_latency: float | None) -> FaultCost:
        """The cost of ``fault`` (module doc)."""
        start = _mono(fault)
        later = bisect.bisect_right(self._round_firsts, start)
        new_rounds = set(self._rounds[later:])

        def is_new(step: Event) -> bool:
            return self._pid_round.get(int(step.get("pid", -1))) in new_rounds

        at = bisect.bisect_right(self._step_times, start)
        resumed = next((e for e in islice(self._steps, at, None) if is_new(e)), None)
        if resumed is None:
            lost = dict.fromkeys(LOST_CATEGORIES, 0.0)
            lost["detection"] = detection_latency or 0.0
            return FaultCost(None, lost)
        end = _mono(resumed)
        first_round = self._rounds[later]
        detected = min(start + (detection_latency if detection_latency is not None else 0.0), end)
        started = min(max(self._round_lasts[first_round], detected), end)
        return FaultCost(end - start, {"detection": detected - start, "recovery": started - detected,
                                       "startup": end - started, "wasted": self._wasted(start, at, resumed)})

    def _wasted(self, start: float, at: int, resumed: Event) -> float:
        """From the old round's report of the first step the new round redid, to the fault:
        walk back from the fault over the old steps while they are at or past that step."""
        redo_from = int(resumed.get("step", 0))
        earliest = None
        for i in range(at - 1, -1, -1):
            step = int(self._steps[i].get("step", -1))
            if step >= redo_from:
                earliest = self._step_times[i]
            elif step < redo_from - 1:  # ranks report out of step by at most one: nothing earlier redone
                break
        return start - earliest if earliest is not None else 0.0


def fault_cost(fault: Event, events: Sequence[Event], detection_latency: float | None) -> FaultCost:
    """The cost of ``fault`` (module doc); ``events`` time-ordered, the whole job's."""
    return TrainingIndex(events).cost(fault, detection_latency)


def goodput(events: Sequence[Event], costs: Sequence[FaultCost],
            fault_times: Sequence[float] = ()) -> Goodput:
    """The job's goodput from its time-ordered events and its faults' costs (module doc).

    Badput is counted as time spans, each instant once: a fault during the initial start-up,
    a checkpoint inside wasted work, two faults whose recoveries overlap are not charged twice.
    An instant goes to the first category that claims it, in ``_PRIORITY`` order.
    ``fault_times``: each cost's fault instant (``mono``), in the same order as ``costs``.
    """
    events = [e for e in events if e.get("kind") not in AFTER_THE_JOB]
    if not events:
        return Goodput(0.0, 0.0, 0.0, {})
    t0, t1 = _mono(events[0]), _mono(events[-1])
    wall = max(t1 - t0, 0.0)
    steps = [e for e in events if e.get("kind") == "step"]
    spans: list[tuple[str, float, float]] = []
    first_step = _mono(steps[0]) if steps else t1
    spans.append(("initial_startup", t0, first_step))
    if steps:
        spans.append(("tail", _mono(steps[-1]), t1))
    counted = [(c, t) for c, t in zip(costs, fault_times, strict=True)
               if c.resume_latency is not None or any(c.lost.values())]
    for cost, at in counted:
        edge = at
        for key in ("detection", "recovery", "startup"):
            spans.append((key, edge, edge + cost.lost[key]))
            edge += cost.lost[key]
        spans.append(("wasted", at - cost.lost["wasted"], at))
    saves = _checkpoints(events)
    spans.extend(("checkpoint", begin, begin + seconds) for begin, seconds in saves)
    badput = _claim(spans)
    productive = max(wall - sum(badput.values()), 0.0)
    resumed = [c.resume_latency for c, _ in counted if c.resume_latency is not None]
    starts = [s for s, _ in saves]
    return Goodput(
        ratio=productive / wall if wall > 0 else 0.0, productive_s=productive, wall_s=wall, badput=badput,
        faults=len(counted),
        restart_cost_s=sum(resumed) / len(resumed) if resumed else None,
        checkpoint_cost_s=sum(d for _, d in saves) / len(saves) if saves else None,
        checkpoint_interval_s=(starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else None,
    )


#: which category an instant claimed by several belongs to
_PRIORITY = ("detection", "recovery", "startup", "initial_startup", "checkpoint", "wasted", "tail")


def _claim(spans: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds per category, each instant counted once (``_PRIORITY`` decides)."""
    taken: list[tuple[float, float]] = []  # disjoint, sorted
    out = dict.fromkeys(_PRIORITY, 0.0)
    for category in _PRIORITY:
        mine = _union([(a, b) for c, a, b in spans if c == category and b > a])
        out[category] = sum(b - a for a, b in mine) - _overlap(mine, taken)
        taken = _union([*taken, *mine])
    return out


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def _checkpoints(events: Sequence[Event]) -> list[tuple[float, float]]:
    """(start, seconds) of each marked checkpoint save, one per save (the slowest rank's)."""
    by_step: dict[Any, tuple[float, float]] = {}
    for e in events:
        if e.get("kind") == "checkpoint" and "seconds" in e:
            key = (e.get("attempt", e.get("restart_count")), e.get("step"))
            seconds = float(e["seconds"])
            begin = _mono(e) - seconds
            prior = by_step.get(key)
            by_step[key] = (min(begin, prior[0]), max(seconds, prior[1])) if prior else (begin, seconds)
    return sorted(by_step.values())


# -- step rate per rank ----------------------------------------------------------------


@dataclass(frozen=True)
class RankRate:
    """One rank's pace: ``steps`` step intervals over ``seconds`` of wall time (each worker
    process's first to last step, summed over its attempts), and ``cpu_wait_s`` of that time
    spent runnable but not running (None: its steps did not report it)."""

    rank: int
    steps: int
    seconds: float
    cpu_wait_s: float | None = None
    #: of that time, on a CPU (None: not reported)
    cpu_run_s: float | None = None

    @property
    def rate(self) -> float | None:
        """Steps per second (None: fewer than two steps of one worker)."""
        return self.steps / self.seconds if self.seconds > 0 else None

    @property
    def step_time(self) -> float | None:
        return self.seconds / self.steps if self.steps else None

    @property
    def cpu_wait(self) -> float | None:
        """The share of its time the rank waited for a CPU (0..1)."""
        if self.cpu_wait_s is None or self.seconds <= 0:
            return None
        return min(1.0, max(0.0, self.cpu_wait_s / self.seconds))

    @property
    def cpu_run(self) -> float | None:
        """The share of a CPU the rank ran on (0..1)."""
        if self.cpu_run_s is None or self.seconds <= 0:
            return None
        return min(1.0, max(0.0, self.cpu_run_s / self.seconds))


def _by_worker(steps: Iterable[Event], since: float | None, until: float | None) -> dict[tuple[int, Any], list[Event]]:
    """(rank, pid) -> that worker's step events with ``mono`` within [since, until], in order."""
    by_worker: dict[tuple[int, Any], list[Event]] = {}
    for step in steps:
        at = _mono(step)
        if (since is not None and at < since) or (until is not None and at > until):
            continue
        by_worker.setdefault((int(step.get("rank", -1)), step.get("pid")), []).append(step)
    return by_worker


def step_times(steps: Iterable[Event], since: float | None = None, until: float | None = None) -> list[float]:
    """Every interval between two consecutive steps of one worker (any rank), in seconds:
    their median is the job's step time, untouched by a warm-up step or a restart's gap."""
    return [_mono(b) - _mono(a) for found in _by_worker(steps, since, until).values()
            for a, b in zip(found, found[1:], strict=False)]


def step_cpu(steps: Iterable[Event], rank: int, since: float | None = None,
             until: float | None = None) -> float | None:
    """The CPU one step of ``rank`` takes, in seconds: the median, over its steps within
    [since, until], of how much its ``cpu_run`` grew from one step to the next (a median: a
    first step's warm-up, DDP's first buckets, would weigh in a mean). None where the rank
    reports no ``cpu_run``."""
    grown = [float(b["cpu_run"]) - float(a["cpu_run"])
             for (each, _), found in _by_worker(steps, since, until).items() if each == rank
             for a, b in zip(found, found[1:], strict=False)
             if isinstance(a.get("cpu_run"), (int, float)) and isinstance(b.get("cpu_run"), (int, float))]
    return statistics.median(grown) if grown else None


def rank_rates(steps: Iterable[Event], since: float | None = None,
               until: float | None = None) -> dict[int, RankRate]:
    """rank -> its ``RankRate`` over the step events (``mono`` within [since, until])."""
    by_worker = _by_worker(steps, since, until)
    totals: dict[int, tuple[int, float, float | None, float | None]] = {}
    for (rank, _pid), found in by_worker.items():
        if len(found) < 2:
            continue
        first, last = found[0], found[-1]
        count, seconds, wait, run = totals.get(rank, (0, 0.0, 0.0, 0.0))
        totals[rank] = (count + len(found) - 1, seconds + _mono(last) - _mono(first),
                        _added(wait, first, last, "cpu_wait"), _added(run, first, last, "cpu_run"))
    return {rank: RankRate(rank, *totals[rank]) for rank in sorted(totals)}


def _added(total: float | None, first: Event, last: Event, key: str) -> float | None:
    """``total`` plus how much the cumulative ``key`` grew from ``first`` to ``last``; None
    once any worker of the rank did not report it."""
    ends = (first.get(key), last.get(key))
    if total is None or ends[0] is None or ends[1] is None:
        return None
    return total + float(ends[1]) - float(ends[0])


def rates_summary(rates: Mapping[int, RankRate]) -> str:
    """One line: each rank's step rate and CPU wait, the rank that waited most for a CPU
    named when it stands out (``straggler``)."""
    if not rates:
        return ""
    parts = []
    for rank, rate in rates.items():
        pace = f"{rate.rate:.1f} steps/s" if rate.rate is not None else "-"
        wait = f", cpu wait {rate.cpu_wait:.0%}" if rate.cpu_wait is not None else ""
        parts.append(f"rank {rank} {pace}{wait}")
    line = "step rate per rank: " + "; ".join(parts)
    slow = straggler(rates)
    if slow is not None:
        line += f" — rank {slow} waited most for a CPU: the straggler"
    return line


def straggler(rates: Mapping[int, RankRate]) -> int | None:
    """The rank that waited for a CPU far more than the others: at least a quarter of its
    time, and a fifth of it more than the others' median (an absolute margin: on a loaded
    machine every rank waits some, and a ratio would call any of them the straggler)."""
    waits = {r: rate.cpu_wait for r, rate in rates.items() if rate.cpu_wait is not None}
    if len(waits) < 2:
        return None
    worst = max(waits, key=lambda r: waits[r])
    others = sorted(w for r, w in waits.items() if r != worst)
    median = others[len(others) // 2]
    return worst if waits[worst] >= max(0.25, median + 0.2) else None


def slow_windows(events: Sequence[Event]) -> list[tuple[Event, float, float | None]]:
    """Each ``slow_node`` fault with the monotonic times it held: (fault, start, end), end
    the ``heal`` that ended it (None: it lasted to the job's end)."""
    windows = []
    for i, event in enumerate(events):
        if event.get("kind") != "fault" or event.get("fault") != "slow_node":
            continue
        node = event.get("target_node")
        end = next((_mono(e) for e in islice(events, i + 1, None) if e.get("kind") == "heal"
                    and "slow_node" in e.get("healed", ()) and e.get("target_node", node) == node), None)
        windows.append((event, _mono(event), end))
    return windows


def rates_report(events: Sequence[Event]) -> str:
    """What the report shows: each rank's step rate over the whole job, and over each span a
    node was slowed (``slow_node``), where the straggler shows (over the whole job its wait
    is diluted by the time it was not slowed)."""
    steps = [e for e in events if e.get("kind") == "step"]
    lines = [rates_summary(rank_rates(steps))]
    for fault, start, end in slow_windows(events):
        during = rates_summary(rank_rates(steps, since=start, until=end))
        if during:
            lines.append(f"while node {fault.get('target_node')} was slowed to cpu={fault.get('cpu')}: "
                         + during.removeprefix("step rate per rank: "))
    return "\n".join(line for line in lines if line)
