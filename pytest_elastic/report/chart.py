"""A job's timeline as text: per node, its worker group's state over time, faults marked.

What a failing test's report section shows, and the page's plain-text chart.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_elastic.report.model import Model, build_model, events_of

__all__ = ["timeline_chart", "draw_chart"]

_STATE_CHARS = {"INIT": "i", "HEALTHY": "=", "UNHEALTHY": "~", "STOPPED": "s", "SUCCEEDED": "+",
                "FAILED": "X", "UNKNOWN": "?"}
_LEGEND = "legend: i init, = healthy, ~ unhealthy, s stopped, X failed, + succeeded, ! fault, _ dead (killed)"


def timeline_chart(timeline: Any, width: int = 64) -> str:
    """Per node, the worker group's state over time; faults marked with '!', a node the
    harness killed blank ('_') from that moment."""
    events, label = events_of(timeline)
    return draw_chart(build_model(events, label), width)


def draw_chart(model: Model, width: int) -> str:
    """``model`` as text ``width`` columns wide (the terminal's and the page's chart)."""
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
