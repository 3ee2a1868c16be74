"""The figures of a session: per job (faults, latencies, restarts, goodput), added up for
the junit properties, and the lines of the terminal's ``elastic summary``.

Loaded by every elastic test (its properties); nothing here draws.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["job_stats", "job_twin_verdict", "sum_by_key", "session_summary", "percentile", "NOT_COMPARED"]

#: the verdict of a job (or a test) that never ran its fault-free twin
NOT_COMPARED = "not compared"


def job_stats(job: Any) -> dict[str, Any]:
    faults = job.timeline.faults()
    detection = [f.detection_latency for f in faults if f.detection_latency is not None]
    recovery = [f.recovery_latency for f in faults if f.recovery_latency is not None]
    resume = [f.resume_latency for f in faults if f.resume_latency is not None]
    goodput = job.timeline.goodput(faults)  # the faults just priced: not priced again
    return {"faults": len(faults), "recovered": len(recovery), "detection": detection,
            "recovery": recovery, "resume": resume,
            "restarts": max(job.timeline.restart_counts().values(), default=0),
            "productive_s": goodput.productive_s, "wall_s": goodput.wall_s, "badput": goodput.badput,
            "goodput_summary": goodput.summary(), "checkpoint_cost_s": goodput.checkpoint_cost_s,
            "checkpoint_interval_s": goodput.checkpoint_interval_s}


def job_twin_verdict(golden: Mapping[str, Any] | None, detail: bool = True) -> str:
    """One job's twin verdict in a phrase, from its last ``golden`` event (None: it never ran
    its twin): ``not compared``, ``same``, ``diverged at rank R step S``, else for a divergence
    no step shows ``diverged: rank R's final state`` or ``diverged: nothing to compare``
    (``detail``: the report's, ``twin.twin_view``) or only ``diverged: final state differs``
    (the junit property ``elastic_twin``, ``pytest_elastic._ci.twin_verdict``)."""
    if golden is None:
        return NOT_COMPARED
    if not golden.get("diverged"):
        return "same"
    first = golden.get("first")
    if first and len(first) >= 4:  # (rank, step, got, expected), as ``twin.Divergence`` reads it
        return f"diverged at rank {int(first[0])} step {int(first[1])}"
    if not detail:
        return "diverged: final state differs"
    mismatch = golden.get("digest_mismatch")
    return f"diverged: rank {mismatch[0]}'s final state" if mismatch else "diverged: nothing to compare"


def sum_by_key(dicts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Seconds by category, added up over jobs (or tests)."""
    total: dict[str, float] = {}
    for d in dicts:
        for key, value in d.items():
            total[key] = total.get(key, 0.0) + value
    return total


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (non-empty), nearest rank: the p95 every report of
    the session prints (terminal summary, index, GitHub step summary) is this one."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def session_summary(stats: list[dict[str, Any]], settings: Any) -> list[str]:
    jobs = sum(s.get("elastic_jobs", 0) for s in stats)
    faults = sum(s.get("elastic_fault_count", 0) for s in stats)
    recovered = sum(s.get("elastic_recovered", 0) for s in stats)
    failed_tests = sum(1 for s in stats if s.get("elastic_outcome") == "failed")
    detection = [v for s in stats for v in s.get("elastic_detection_latencies", [])]
    recovery = [v for s in stats for v in s.get("elastic_recovery_latencies", [])]
    resume = [v for s in stats for v in s.get("elastic_resume_latencies", [])]
    lines = [f"elastic tests: {len(stats)} ({failed_tests} failed), jobs: {jobs}, "
             f"faults injected: {faults}, recovered: {recovered}"]
    for name, values in (("detection", detection), ("recovery", recovery), ("training resumed", resume)):
        if values:
            lines.append(f"{name} latency: median {statistics.median(values) * 1000:.0f} ms, "
                         f"p95 {percentile(values, 0.95) * 1000:.0f} ms (n={len(values)})")
    productive = sum(s.get("elastic_productive_s", 0.0) for s in stats)
    wall = sum(s.get("elastic_wall_s", 0.0) for s in stats)
    if wall > 0:
        lost = sum_by_key(s.get("elastic_lost", {}) for s in stats)
        spent = sum(lost.get(k, 0.0) for k in ("detection", "recovery", "startup", "wasted"))
        detail = ", ".join(f"{k} {lost.get(k, 0.0):.1f} s" for k in ("detection", "recovery", "startup", "wasted"))
        lines.append(f"goodput {productive / wall:.2f} ({productive:.1f} s of {wall:.1f} s trained); "
                     f"lost {spent:.1f} s to {faults} fault(s): {detail}")
    if getattr(settings, "project", None):
        lines.append(_projection_line(stats, settings.project, resume))
    shrunk = [s for s in stats if "elastic_minimal_faults" in s]
    if shrunk:
        lines.append(f"shrunk: {len(shrunk)} failing chaos test(s), to "
                     f"{', '.join(str(s['elastic_minimal_faults']) for s in shrunk)} fault(s); "
                     "see their 'elastic chaos: minimal failing schedule' sections")
    left_out: dict[str, dict[str, int]] = {}  # kind -> why -> tests
    for s in stats:
        for kind, why in (s.get("elastic_chaos_left_out") or {}).items():
            left_out.setdefault(kind, {}).setdefault(why, 0)
            left_out[kind][why] += 1
    lines.extend(_left_out_lines(left_out))
    if settings.chaos:
        lines.append(f"chaos seed: {settings.seed} (replay with --elastic-chaos --elastic-seed={settings.seed})")
    return lines


def _left_out_lines(left_out: dict[str, dict[str, int]]) -> list[str]:
    """One line per reason chaos left kinds out of the session's jobs: the kinds left out of
    as many tests for the same most common reason share a line."""
    grouped: dict[tuple[int, str, int], list[str]] = {}
    for kind, whys in left_out.items():
        tests = sum(whys.values())
        why = max(whys, key=lambda w: (whys[w], w))
        grouped.setdefault((tests, why, len(whys) - 1), []).append(kind)
    lines = []
    for (tests, why, others), kinds in sorted(grouped.items(), key=lambda item: (-item[0][0], item[1])):
        more = f" (and {others} other reason(s): each test's 'elastic chaos' section)" if others else ""
        lines.append(f"chaos left out {', '.join(kinds)} in {tests} test(s): {why}{more}")
    return lines


def _projection_line(stats: list[dict[str, Any]], spec: str, resume: list[float]) -> str:
    """``--elastic-project``: the session's mean cost per fault and per checkpoint, at scale."""
    from harness.errors import ConfigError
    from harness.sim.truth.projection import project_goodput
    from pytest_elastic._settings import parse_project

    kwargs = parse_project(spec)
    costs = [c for s in stats for c in s.get("elastic_checkpoint_costs", [])]
    intervals = [i for s in stats for i in s.get("elastic_checkpoint_intervals", [])]
    kwargs.setdefault("restart_cost_s", statistics.mean(resume) if resume else None)
    kwargs.setdefault("checkpoint_cost_s", statistics.mean(costs) if costs else None)
    kwargs.setdefault("checkpoint_interval_s", statistics.mean(intervals) if intervals else None)
    try:
        return "projected: " + project_goodput(**kwargs).summary()
    except ConfigError as e:
        return (f"projected: cannot project ({e}); mark checkpoint saves with harness.report_checkpoint() "
                "or pass interval=S,checkpoint=S to --elastic-project")
