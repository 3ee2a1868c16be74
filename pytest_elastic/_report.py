"""What a person reads: a text chart of a job's timeline, the session summary, HTML."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from typing import Any

__all__ = ["timeline_chart", "session_summary", "write_html", "job_stats", "explain_job"]

_STATE_CHARS = {"INIT": "i", "HEALTHY": "=", "UNHEALTHY": "~", "STOPPED": "s", "SUCCEEDED": "+",
                "FAILED": "X", "UNKNOWN": "?"}
_LEGEND = "legend: i init, = healthy, ~ unhealthy, s stopped, X failed, + succeeded, ! fault, _ dead (killed)"


def _events_of(source: Any) -> tuple[list[dict[str, Any]], Any]:
    """A ``Timeline`` or a plain event list (synthetic input): its events and label function."""
    from pytest_elastic._report_model import labeler

    events = source.events() if hasattr(source, "events") else list(source)
    return events, labeler(source, events)


def timeline_chart(timeline: Any, width: int = 64) -> str:
    """Per node, the worker group's state over time; faults marked with '!', a node the
    harness killed blank ('_') from that moment."""
    from pytest_elastic._report_model import build_model

    events, label = _events_of(timeline)
    return _chart(build_model(events, label), width)


def _chart(model: Any, width: int) -> str:
    lanes = [lane for lane in model.lanes if lane.states]
    if not lanes:
        return "(no state events)"
    span = model.duration
    name_w = max(len(n) for n in [lane.label for lane in lanes] + ["faults"])
    lines = [f"{'':>{name_w}}  0s{'':>{width - 10}}{span:6.2f}s"]

    def column(t: float) -> int:
        return min(width - 1, int(t / span * (width - 1)))

    for lane in lanes:
        row = [" "] * width
        for state in lane.states:
            first, last = column(state.start), column(state.end)
            row[first:last + 1] = _STATE_CHARS.get(state.cls, "?") * (last + 1 - first)
        if lane.dead_at is not None:
            first = column(lane.dead_at) + 1
            row[first:] = "_" * (width - first)
        lines.append(f"{lane.label:>{name_w}} |{''.join(row)}|")
    marks = [" "] * width
    for fault in model.faults:
        marks[column(fault.at)] = "!"
    lines.append(f"{'faults':>{name_w}} |{''.join(marks)}|")
    for fault in model.faults:
        detail = {k: v for k, v in fault.event.items()
                  if k not in ("ts", "mono", "node", "pid", "run_id", "kind", "fault")}
        lines.append(f"{'':>{name_w}}  ! {fault.at:6.3f}s {fault.kind} {json.dumps(detail, default=str)}")
    lines.append(_LEGEND)
    return "\n".join(lines)


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


def sum_by_key(dicts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Seconds by category, added up over jobs (or tests)."""
    total: dict[str, float] = {}
    for d in dicts:
        for key, value in d.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _percentile(values: list[float], q: float) -> float:
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
                         f"p95 {_percentile(values, 0.95) * 1000:.0f} ms (n={len(values)})")
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
    if settings.chaos:
        lines.append(f"chaos seed: {settings.seed} (replay with --elastic-chaos --elastic-seed={settings.seed})")
    return lines


def _projection_line(stats: list[dict[str, Any]], spec: str, resume: list[float]) -> str:
    """``--elastic-project``: the session's mean cost per fault and per checkpoint, at scale."""
    from harness.errors import ConfigError
    from harness.sim.projection import project_goodput
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


def write_html(path: str, title: str, timeline: Any, extra: str = "", *, info: dict[str, Any] | None = None,
               failures: str = "", nproc: int = 0) -> dict[str, Any]:
    """A self-contained HTML page for one job (see ``_report_page``); returns its figures
    for the session index."""
    from pytest_elastic._report_model import build_model
    from pytest_elastic._report_page import build_page, page_figures

    events, label = _events_of(timeline)
    model = build_model(events, label)
    page = build_page(title, model, events, nproc=nproc, info=info, failures=failures,
                      chart=_chart(model, width=100), extra=extra)
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(page)
    return page_figures(model)


def explain_job(job: Any, captured: list[dict[str, Any]] | None = None) -> str:
    """Why ``job``'s ranks failed: the ``captured`` failures (read while its files existed,
    with tracebacks) or else what its timeline's results say."""
    from pytest_elastic._report_failures import explain_failures, failures_from_events

    events, label = _events_of(job.timeline)
    final = captured if captured else failures_from_events(events, label)
    return explain_failures(final, events, label)
