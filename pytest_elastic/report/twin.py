"""What the job page shows of the fault-free twin, computed once from the job's events (no
drawing here: ``twin_svg`` draws it).

The verdict and the twin's side come from the job's last ``golden`` event
(``harness.sim.truth.golden.event_fields``: the twin's losses, thinned to a cap, and both runs'
final digests); the run's side from its own ``step`` events, every report of every attempt,
so the steps a resume redid show as that attempt's own curve over the same steps.

A job that never ran its twin has no view (``twin_view`` returns None); an event written
before the event carried the twin's losses still gives the verdict, without the curve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.sim.truth.golden import HINT, record_of, same_loss
from pytest_elastic.report.stats import NOT_COMPARED, job_twin_verdict

__all__ = ["Attempt", "Resume", "RankCurves", "Divergence", "DigestRow", "TwinView", "twin_view", "twin_summary",
           "combine_verdicts", "relative_difference", "tolerance_text", "MAX_RANKS", "NOT_COMPARED"]

#: ranks drawn on the page (the divergent rank always is); the others are named, not drawn
MAX_RANKS = 8

Point = tuple[int, float]  # (step, loss)


@dataclass(frozen=True)
class Attempt:
    """One worker process of a rank: its (step, loss) reports in the order it made them.
    ``attempt`` is the restart count it was started for (the ``attempt`` of its steps)."""

    attempt: int
    pid: int
    points: list[Point]

    @property
    def first_step(self) -> int:
        return self.points[0][0]


@dataclass(frozen=True)
class Resume:
    """Where a later attempt of a rank began: its ``index`` among the rank's attempts (0 is
    the first process), its restart count, and the last step an earlier attempt had reached
    (``redone_to`` >= ``step``: steps ``step..redone_to`` were done again)."""

    step: int
    index: int
    restart_count: int
    redone_to: int | None


@dataclass(frozen=True)
class Divergence:
    """The first (rank, step) whose loss is not the twin's; ``got`` None: the run never
    reported that step."""

    rank: int
    step: int
    got: float | None
    expected: float | None
    rel_diff: float | None
    attempt: int | None = None
    resumed_at: int | None = None

    def text(self) -> str:
        rel = "" if self.rel_diff is None else f" (relative difference {self.rel_diff:.3g})"
        return (f"rank {self.rank}, step {self.step}: loss {_show(self.got)} vs the twin's "
                f"{_show(self.expected)}{rel}")


@dataclass(frozen=True)
class RankCurves:
    """One rank's drawing: the twin's curve, the run's attempts over it, where each later
    attempt resumed, the steps whose counted loss differs from the twin's, the first one."""

    rank: int
    twin: list[Point]
    attempts: list[Attempt]
    resumes: list[Resume]  # each attempt after the first
    differs: list[int]
    first: Divergence | None = None


@dataclass(frozen=True)
class DigestRow:
    """A rank's final state digests, the run's and the twin's, and what the oracle made of them."""

    rank: int
    run: str | None
    twin: str | None
    verdict: str  # "equal", "differ", "not compared: ...", "only the run has one", ...


@dataclass(frozen=True)
class TwinView:
    """Everything the page's twin section says (module doc)."""

    diverged: bool
    verdict: str  # the index's cell: "same", "diverged at rank r step s", ...
    headline: str  # the page's first line about the twin
    tolerance: str  # "bitwise" or "rtol=..."
    why: str  # why that tolerance
    steps_compared: int
    cached: bool
    note: str
    expected: bool  # diverged, and the test passed anyway: it expected the divergence
    first: Divergence | None
    ranks: list[RankCurves]
    hidden_ranks: list[int]
    twin_points: int  # the twin's losses the event carried
    twin_total: int  # the twin's losses in all (more than twin_points: thinned)
    digests: list[DigestRow]
    hint: str = HINT
    world_sizes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def capped(self) -> bool:
        return self.twin_total > self.twin_points


def _show(value: float | None) -> str:
    return "missing" if value is None else repr(value)


def relative_difference(got: float | None, expected: float | None) -> float | None:
    """|got - expected| / |expected| (the absolute difference when the twin's is 0); None when
    either is missing or not finite."""
    if got is None or expected is None or not (math.isfinite(got) and math.isfinite(expected)):
        return None
    diff = abs(got - expected)
    return diff / abs(expected) if expected != 0 else diff


def tolerance_text(rtol: float, world_size_changed: bool, note: str) -> tuple[str, str]:
    """(the tolerance, why that one): bitwise unless the world size changed or the test asked."""
    if rtol == 0:
        return "bitwise", ("the same script with the same seeds on the same world size computes the same "
                           "bits (CPU, gloo), so any difference is a divergence")
    if world_size_changed:
        return f"rtol={rtol:g}", note or "the world size changed: another world size sums in another order"
    return f"rtol={rtol:g}", "the test asked for it (golden_rtol)"


def _last_golden(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = None
    for e in events:
        if e.get("kind") == "golden":
            found = e  # compare_golden() called twice: the last verdict stands
    return found


def _attempts(steps: list[Mapping[str, Any]]) -> dict[int, list[Attempt]]:
    """rank -> its processes in the order they first reported, each with its (step, loss)s."""
    by_rank: dict[int, dict[int, Attempt]] = {}
    for e in steps:
        loss = e.get("loss")
        if loss is None:
            continue
        rank, pid = int(e.get("rank", -1)), int(e.get("pid", -1))
        procs = by_rank.setdefault(rank, {})
        found = procs.get(pid)
        if found is None:
            found = procs[pid] = Attempt(int(e.get("attempt", e.get("restart_count", 0))), pid, [])
        found.points.append((int(e.get("step", -1)), float(loss)))
    return {rank: list(procs.values()) for rank, procs in by_rank.items()}


def _first(golden: Mapping[str, Any]) -> Divergence | None:
    first = golden.get("first")
    if not first or len(first) < 4:
        return None
    rank, step, got, expected = first[:4]
    got = None if got is None else float(got)
    expected = None if expected is None else float(expected)
    return Divergence(int(rank), int(step), got, expected, relative_difference(got, expected),
                      golden.get("attempt"), golden.get("resumed_at"))


def _digest_rows(golden: Mapping[str, Any]) -> list[DigestRow]:
    digests = golden.get("digests") or {}
    run, twin = digests.get("run") or {}, digests.get("twin") or {}
    changed = bool(golden.get("world_size_changed"))
    rows = []
    for rank in sorted({int(r) for r in [*run, *twin]}):
        mine, theirs = run.get(str(rank)), twin.get(str(rank))
        if mine is None or theirs is None:
            verdict = "only the twin has one" if mine is None else "only the run has one"
        elif changed:
            verdict = "not compared: the world size changed (a digest of a sharded state is per shard)"
        else:
            verdict = "equal" if mine == theirs else "differ"
        rows.append(DigestRow(rank, mine, theirs, verdict))
    return rows


def _headline(golden: Mapping[str, Any], first: Divergence | None, tolerance: str) -> str:
    """The page's first line about the twin (its verdict in a phrase: ``stats.job_twin_verdict``)."""
    compared = int(golden.get("steps_compared") or 0)
    if not golden.get("diverged"):
        return (f"same as its fault-free twin: {compared} (rank, step) losses compared, "
                f"{tolerance if tolerance == 'bitwise' else 'with ' + tolerance}")
    if first is not None:
        return f"diverged from its fault-free twin at {first.text()}, compared {tolerance}"
    mismatch = golden.get("digest_mismatch")
    if mismatch:
        return (f"every one of {compared} (rank, step) losses matched its fault-free twin's, but rank "
                f"{mismatch[0]}'s final state differs (digest {str(mismatch[1])[:12]}… vs {str(mismatch[2])[:12]}…)")
    return f"not the same as its fault-free twin: {golden.get('note') or 'no losses'}"


def twin_view(events: Iterable[Mapping[str, Any]], test_passed: bool | None = None,
              max_ranks: int = MAX_RANKS) -> TwinView | None:
    """The page's twin section from a job's events; None when the job never ran its twin.
    ``test_passed``: the test's outcome: a divergence in a test that passed was expected
    (``diverges = true``; a golden test or ``same_as_golden`` fails on one)."""
    events = list(events)
    golden = _last_golden(events)
    if golden is None:
        return None
    steps = [e for e in events if e.get("kind") == "step"]
    rtol = float(golden.get("rtol") or 0.0)
    changed = bool(golden.get("world_size_changed"))
    note = str(golden.get("note") or "")
    tolerance, why = tolerance_text(rtol, changed, note)
    first = _first(golden)
    verdict, headline = job_twin_verdict(golden), _headline(golden, first, tolerance)
    diverged = bool(golden.get("diverged"))
    twin: dict[int, list[Point]] = {}
    for rank, step, loss in golden.get("twin_losses") or []:
        twin.setdefault(int(rank), []).append((int(step), float(loss)))
    attempts = _attempts(steps)
    counted = record_of(steps).losses  # the last report of each (rank, step): what the oracle judged
    ranks = sorted(set(twin) | set(attempts))
    shown = ranks[:max_ranks]
    if first is not None and first.rank not in shown and first.rank in ranks:
        shown = [*ranks[:max_ranks - 1], first.rank]
    curves = [_rank_curves(rank, sorted(twin.get(rank, [])), attempts.get(rank, []), counted, rtol, first)
              for rank in shown]
    return TwinView(diverged=diverged, verdict=verdict, headline=headline, tolerance=tolerance, why=why,
                    steps_compared=int(golden.get("steps_compared") or 0), cached=bool(golden.get("cached")),
                    note=note, expected=diverged and test_passed is True, first=first, ranks=curves,
                    hidden_ranks=[r for r in ranks if r not in shown],
                    twin_points=len(golden.get("twin_losses") or []),
                    twin_total=int(golden.get("twin_losses_total") or 0), digests=_digest_rows(golden),
                    world_sizes={k: list(v) for k, v in (golden.get("world_sizes") or {}).items()})


def _rank_curves(rank: int, twin: list[Point], attempts: list[Attempt], counted: Mapping[tuple[int, int], float],
                 rtol: float, first: Divergence | None) -> RankCurves:
    resumes = []
    reached: int | None = None
    for index, attempt in enumerate(attempts):
        if index:
            redone = reached if reached is not None and reached >= attempt.first_step else None
            resumes.append(Resume(attempt.first_step, index, attempt.attempt, redone))
        top = max(s for s, _ in attempt.points)
        reached = top if reached is None else max(reached, top)
    differs = [step for step, expected in twin
               if (rank, step) in counted and not same_loss(counted[(rank, step)], expected, rtol)]
    return RankCurves(rank, twin, attempts, resumes, differs,
                      first if first is not None and first.rank == rank else None)


def twin_summary(view: TwinView | None) -> dict[str, Any]:
    """What the session index needs of one job's twin (JSON): its verdict and sort key."""
    if view is None:
        return {"verdict": NOT_COMPARED, "diverged": None}
    summary: dict[str, Any] = {"verdict": view.verdict, "diverged": view.diverged, "expected": view.expected,
                               "tolerance": view.tolerance}
    if view.first is not None:
        summary.update(rank=view.first.rank, step=view.first.step)
    return summary


def combine_verdicts(jobs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A test's twin verdict from its jobs': the first divergent job's, else "same" if any job
    was compared, else "not compared"; ``order`` sorts the index's column (not compared <
    same < diverged)."""
    many = len(jobs) > 1
    for i, job in enumerate(jobs):
        if job.get("diverged"):
            text = str(job.get("verdict")) + (f" (job {i})" if many else "")
            if job.get("expected"):
                text += ", as expected"
            return {"verdict": text, "diverged": True, "order": 2}
    if any(job.get("diverged") is False for job in jobs):
        return {"verdict": "same", "diverged": False, "order": 1}
    return {"verdict": NOT_COMPARED, "diverged": None, "order": 0}
