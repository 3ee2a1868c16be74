"""What a person reads: a text chart of a job's timeline, the session summary, HTML."""

from __future__ import annotations

import html
import json
import statistics
from typing import Any

__all__ = ["timeline_chart", "session_summary", "write_html", "job_stats"]

_STATE_CHARS = {"INIT": "i", "HEALTHY": "=", "UNHEALTHY": "~", "STOPPED": "s", "SUCCEEDED": "+",
                "FAILED": "X", "UNKNOWN": "?"}
_LEGEND = "legend: i init, = healthy, ~ unhealthy, s stopped, X failed, + succeeded, ! fault"


def timeline_chart(timeline: Any, width: int = 64) -> str:
    """Per node, the worker group's state over time; faults marked with '!'."""
    events = timeline.events()
    states = [e for e in events if e.get("kind") == "state"]
    faults = [e for e in events if e.get("kind") == "fault"]
    if not states:
        return "(no state events)"
    t0 = min(e["mono"] for e in events)
    t1 = max(e["mono"] for e in events)
    span = max(t1 - t0, 1e-3)
    nodes = list(dict.fromkeys(e["node"] for e in states))
    label = max(len(str(n)) for n in nodes + ["faults"])
    lines = [f"{'':>{label}}  0s{'':>{width - 10}}{span:6.2f}s"]

    def column(t: float) -> int:
        return min(width - 1, int((t - t0) / span * (width - 1)))

    for node in nodes:
        row = [" "] * width
        mine = [e for e in states if e["node"] == node]
        for i, event in enumerate(mine):
            end = mine[i + 1]["mono"] if i + 1 < len(mine) else t1
            char = _STATE_CHARS.get(event["state"], "?")
            for c in range(column(event["mono"]), column(end) + 1):
                row[c] = char
        lines.append(f"{node:>{label}} |{''.join(row)}|")
    marks = [" "] * width
    for fault in faults:
        marks[column(fault["mono"])] = "!"
    lines.append(f"{'faults':>{label}} |{''.join(marks)}|")
    for fault in faults:
        detail = {k: v for k, v in fault.items() if k not in ("ts", "mono", "node", "pid", "run_id", "kind", "fault")}
        lines.append(f"{'':>{label}}  ! {fault['mono'] - t0:6.3f}s {fault['fault']} {json.dumps(detail)}")
    lines.append(_LEGEND)
    return "\n".join(lines)


def job_stats(job: Any) -> dict[str, Any]:
    faults = job.timeline.faults()
    detection = [f.detection_latency for f in faults if f.detection_latency is not None]
    recovery = [f.recovery_latency for f in faults if f.recovery_latency is not None]
    return {"faults": len(faults), "recovered": len(recovery), "detection": detection,
            "recovery": recovery, "restarts": max(job.timeline.restart_counts().values(), default=0)}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def session_summary(stats: list[dict], settings: Any) -> list[str]:
    jobs = sum(s.get("elastic_jobs", 0) for s in stats)
    faults = sum(s.get("elastic_fault_count", 0) for s in stats)
    recovered = sum(s.get("elastic_recovered", 0) for s in stats)
    failed_tests = sum(1 for s in stats if s.get("elastic_outcome") == "failed")
    detection = [v for s in stats for v in s.get("elastic_detection_latencies", [])]
    recovery = [v for s in stats for v in s.get("elastic_recovery_latencies", [])]
    lines = [f"elastic tests: {len(stats)} ({failed_tests} failed), jobs: {jobs}, "
             f"faults injected: {faults}, recovered: {recovered}"]
    for name, values in (("detection", detection), ("recovery", recovery)):
        if values:
            lines.append(f"{name} latency: median {statistics.median(values) * 1000:.0f} ms, "
                         f"p95 {_percentile(values, 0.95) * 1000:.0f} ms (n={len(values)})")
    shrunk = [s for s in stats if "elastic_minimal_faults" in s]
    if shrunk:
        lines.append(f"shrunk: {len(shrunk)} failing chaos test(s), to "
                     f"{', '.join(str(s['elastic_minimal_faults']) for s in shrunk)} fault(s); "
                     "see their 'elastic chaos: minimal failing schedule' sections")
    if settings.chaos:
        lines.append(f"chaos seed: {settings.seed} (replay with --elastic-chaos --elastic-seed={settings.seed})")
    return lines


def write_html(path: str, title: str, timeline: Any, extra: str = "") -> None:
    """A self-contained HTML page: the chart, the fault table and every event."""
    chart = html.escape(timeline_chart(timeline, width=100))
    rows = "".join(
        f"<tr><td>{e.get('mono', 0):.3f}</td><td>{html.escape(str(e.get('node')))}</td>"
        f"<td>{html.escape(str(e.get('kind')))}</td><td>{html.escape(json.dumps(e, default=str))}</td></tr>"
        for e in timeline.events())
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif}pre{background:#f4f4f4;padding:1em}"
            "td{font-family:monospace;font-size:12px;padding:0 .5em;vertical-align:top}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><pre>{chart}</pre><pre>{html.escape(extra)}</pre>"
            f"<table><tr><th>t</th><th>node</th><th>kind</th><th>event</th></tr>{rows}</table></body></html>")
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(page)
