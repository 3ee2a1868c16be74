"""The drawn timeline: a ``Model`` as inline SVG (no script needed to see it).

Spans of one kind in one row share a single ``<path>`` (a 40-node, 10-minute job has tens
of thousands of them: one element each would blow the 2 MB budget); what a tooltip needs
for them goes to the page as compact rows (``rows``) that its script searches by time.
Faults and rounds are few and get an element each, with a ``<title>``.
"""

from __future__ import annotations

import html
import math
from typing import Any

from pytest_elastic.report.model import LEAVE_FAULTS, Fault, Lane, Model, Span, fault_text

__all__ = ["render_timeline", "render_steps", "STATE_COLOURS", "WORKER_COLOURS", "LABEL_W", "PLOT_W"]

LABEL_W = 150  # node labels
PLOT_W = 1200  # the time axis
_TOP = 46  # axis, rounds, fault markers
_NODE_H = 12
_WORKER_H = 5
_GAP = 5
STATE_COLOURS = {"INIT": "#9aa5b1", "HEALTHY": "#2e9e4f", "UNHEALTHY": "#f08c00", "STOPPED": "#f5c542",
                 "SUCCEEDED": "#2f6fd6", "FAILED": "#d62f2f", "UNKNOWN": "#8e44ad"}
WORKER_COLOURS = {"running": "#7cc48f", "ok": "#7aa6ea", "stopped": "#b8b8b8", "failed": "#e35d5d"}


class _Scale:
    def __init__(self, duration: float):
        self.k = PLOT_W / max(duration, 1e-3)

    def x(self, t: float) -> float:
        return LABEL_W + t * self.k


def _ticks(duration: float, count: int = 10) -> list[float]:
    raw = duration / count
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(duration / step) + 1)]


def _fmt_time(t: float) -> str:
    if t >= 60:
        return f"{int(t // 60)}m{t % 60:02.0f}s"
    return f"{t:g}s"


def _span_path(spans: list[Span], scale: _Scale, y: float, h: float, min_w: float = 0.8) -> str:
    """Adjacent spans merged; every span at least ``min_w`` px wide so a short one shows."""
    boxes: list[list[float]] = []
    k, left = scale.k, LABEL_W
    for span in spans:
        x = left + span.start * k
        x2 = max(left + span.end * k, x + min_w)
        if boxes and x <= boxes[-1][1] + 0.05:  # touches the previous one: extend it
            if x2 > boxes[-1][1]:
                boxes[-1][1] = x2
        else:
            boxes.append([x, x2])
    return "".join(f"M{x:.1f} {y:g}h{x2 - x:.1f}v{h:g}h{x - x2:.1f}z" for x, x2 in boxes)


def _by_class(spans: list[Span]) -> dict[str, list[Span]]:
    groups: dict[str, list[Span]] = {}
    for span in spans:
        groups.setdefault(span.cls, []).append(span)
    return groups


def _row_data(spans: list[Span]) -> list[list[Any]]:
    return [[round(s.start, 3), round(s.end, 3), s.cls, *s.extra] for s in spans]


class _Layers:
    """Where each element goes: ``zoom`` is stretched along time by the page's zoom, ``pin``
    elements (markers, labels at a time) only move with it so they keep their shape, and
    ``labels`` (node names) stay put at the left while the plot scrolls."""

    def __init__(self) -> None:
        self.zoom: list[str] = []
        self.pin: list[str] = []
        self.labels: list[str] = []


def _lane(lane: Lane, index: int, y: float, scale: _Scale, rows: list[dict[str, Any]], nproc: int,
          layers: _Layers) -> float:
    layers.labels.append(f'<text class="label" x="{LABEL_W - 6}" y="{y + _NODE_H - 2:g}">'
                         f'{html.escape(lane.label)}</text>')
    out = [f'<g class="lane" data-lane="{index}" data-node="{html.escape(lane.label)}">',
           f'<rect class="row" data-row="{len(rows)}" x="{LABEL_W}" y="{y:g}" width="{PLOT_W}" height="{_NODE_H}"/>']
    rows.append({"kind": "state", "node": lane.label, "spans": _row_data(lane.states)})
    for cls, spans in _by_class(lane.states).items():
        out.append(f'<path class="st st-{html.escape(cls)}" d="{_span_path(spans, scale, y, _NODE_H)}"/>')
    wy = y + _NODE_H + 1
    for local_rank in sorted(set(range(nproc)) | set(lane.workers)):
        spans = sorted(lane.workers.get(local_rank, []), key=lambda s: s.start)
        out.append(f'<rect class="row" data-row="{len(rows)}" x="{LABEL_W}" y="{wy:g}" width="{PLOT_W}" '
                   f'height="{_WORKER_H}"/>')
        rows.append({"kind": "worker", "node": lane.label, "local_rank": local_rank, "spans": _row_data(spans)})
        for cls, group in _by_class(spans).items():
            out.append(f'<path class="wk wk-{cls}" d="{_span_path(group, scale, wy, _WORKER_H - 1)}"/>')
        wy += _WORKER_H
    for span in lane.faults:  # lasting faults aimed at this node, over its lane
        x, x2 = scale.x(span.start), max(scale.x(span.end), scale.x(span.start) + 2)
        out.append(f'<rect class="fault-span on-lane f-{html.escape(span.cls)}" x="{x:.1f}" y="{y - 1:g}" '
                   f'width="{x2 - x:.1f}" height="{wy - y + 2:g}"><title>{html.escape(span.text)}</title></rect>')
    if lane.dead_at is not None:
        x = scale.x(lane.dead_at)
        kind = "left" if lane.dead_by in LEAVE_FAULTS else "killed"
        out.append(f'<rect class="dead {kind}" x="{x:.1f}" y="{y:g}" width="{LABEL_W + PLOT_W - x:.1f}" '
                   f'height="{wy - y:g}"><title>{html.escape(lane.label)}: {lane.dead_by} at '
                   f'{lane.dead_at:.3f}s, gone from then on</title></rect>')
        layers.pin.append(f'<text class="dead-label" data-x="{x:.1f}" x="{x + 3:.1f}" y="{y + _NODE_H - 2:g}">'
                          f'✝ {lane.dead_by}</text>')
    out.append("</g>")
    layers.zoom.append("".join(out))
    return wy + _GAP


def _fault(fault: Fault, index: int, scale: _Scale, bottom: float, layers: _Layers) -> None:
    x = scale.x(fault.at)
    title = html.escape(fault_text(fault))
    cls = html.escape(fault.kind)
    layers.zoom.append(f'<line class="fault-line" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP - 4}" y2="{bottom:g}"/>')
    if fault.end is not None and fault.end > fault.at:
        x2 = scale.x(fault.end)
        layers.zoom.append(f'<rect class="fault-span f-{cls}" data-f="{index}" x="{x:.1f}" y="{_TOP - 13}" '
                           f'width="{max(x2 - x, 2):.1f}" height="6"><title>{title}</title></rect>')
    layers.pin.append(f'<path class="fault-marker f-{cls}" data-f="{index}" data-x="{x:.1f}" '
                      f'd="M{x:.1f} {_TOP - 4}l-5 -9h10z"><title>{title}</title></path>')


#: the lost-time categories' colours: the timeline's bars and the page's fault table share them
LOST_COLOURS = {"wasted": "#9e9e9e", "detection": "#f08c00", "recovery": "#f5c542", "startup": "#4a90d9"}


def _shading(fault: Fault, scale: _Scale, bottom: float) -> str:
    """Fault -> detection (darker), detection -> recovery (lighter), behind the lanes."""
    out = []
    x = scale.x(fault.at)
    if fault.detection is not None:
        xd = scale.x(fault.at + fault.detection)
        out.append(f'<rect class="detect" x="{x:.1f}" y="{_TOP}" width="{max(xd - x, 0.5):.1f}" '
                   f'height="{bottom - _TOP:g}"/>')
        if fault.recovery is not None and fault.recovery > fault.detection:
            xr = scale.x(fault.at + fault.recovery)
            out.append(f'<rect class="recover" x="{xd:.1f}" y="{_TOP}" width="{xr - xd:.1f}" '
                       f'height="{bottom - _TOP:g}"/>')
    out.append(_lost_bar(fault, scale))
    return "".join(out)


def _lost_bar(fault: Fault, scale: _Scale) -> str:
    """The fault's lost time as a stacked bar on the time axis, just above the lanes: the
    wasted work before it (grey), then detection, recovery and start-up up to the step that
    resumed training."""
    if not fault.lost:
        return ""
    edges = [("wasted", fault.at - fault.lost.get("wasted", 0.0), fault.at)]
    t = fault.at
    for key in ("detection", "recovery", "startup"):
        edges.append((key, t, t + fault.lost.get(key, 0.0)))
        t += fault.lost.get(key, 0.0)
    out = []
    for key, a, b in edges:
        if b > a:
            xa, xb = scale.x(a), scale.x(b)
            out.append(f'<rect class="lost lost-{key}" x="{xa:.1f}" y="{_TOP - 3}" width="{max(xb - xa, 0.5):.1f}" '
                       f'height="3" fill="{LOST_COLOURS[key]}"><title>{key}: {(b - a) * 1000:.0f} ms</title></rect>')
    return "".join(out)


def _rounds(model: Model, scale: _Scale, layers: _Layers) -> None:
    last_label = -1e9
    for i, rnd in enumerate(model.rounds):
        x = scale.x(rnd.at)
        title = html.escape(f"rendezvous round {rnd.round}: world size {rnd.world_size}, "
                            f"{rnd.nodes} node(s), at {rnd.at:.3f}s")
        parts = [f'<g class="round" data-round="{i}" data-x="{x:.1f}"><line class="round-line" x1="{x:.1f}" '
                 f'x2="{x:.1f}" y1="{_TOP - 26}" y2="{_TOP - 14}"/>']
        label = f"ws={rnd.world_size}"
        if x - last_label > 7 * len(label) + 6:  # labels that would overlap are left to the tooltip
            parts.append(f'<text class="round-label" x="{x + 2:.1f}" y="{_TOP - 18}">{html.escape(label)}</text>')
            last_label = x
        parts.append(f'<rect class="round-hit" x="{x - 2:.1f}" y="{_TOP - 26}" width="4" height="10">'
                     f'<title>{title}</title></rect></g>')
        layers.pin.append("".join(parts))


def render_timeline(model: Model, nproc: int = 0) -> tuple[str, list[dict[str, Any]]]:
    """The SVG and the rows its tooltips search (``rows[i]`` for ``data-row=i``)."""
    scale = _Scale(model.duration)
    rows: list[dict[str, Any]] = []
    layers = _Layers()
    lanes = _Layers()  # drawn above the shading: their own zoom layer
    y = float(_TOP + 4)
    for index, lane in enumerate(model.lanes):
        y = _lane(lane, index, y, scale, rows, nproc, lanes)
    bottom = y
    major = _ticks(model.duration)
    minor = [t for t in _ticks(model.duration, 80) if min(abs(t - m) for m in major) > 1e-9]
    for ticks, cls in ((major, ""), (minor, " minor")):  # minor ticks show when zoomed in
        for t in ticks:
            x = scale.x(t)
            layers.zoom.append(f'<line class="tick{cls}" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP - 30}" y2="{bottom:g}"/>')
            layers.pin.append(f'<text class="tick-label{cls}" data-x="{x:.1f}" x="{x:.1f}" y="{_TOP - 33}">'
                              f'{_fmt_time(t)}</text>')
    layers.zoom.extend(_shading(f, scale, bottom) for f in model.faults)
    _rounds(model, scale, layers)
    layers.zoom.extend(lanes.zoom)
    layers.pin.extend(lanes.pin)
    for i, fault in enumerate(model.faults):
        _fault(fault, i, scale, bottom, layers)
    for end in model.ends:  # heals: a green mark where a lasting fault ended
        x = scale.x(end.at)
        layers.pin.append(f'<path class="fault-end" data-x="{x:.1f}" d="M{x:.1f} {_TOP - 13}l-4 7h8z"><title>'
                          f'{html.escape(fault_text(end))}</title></path>')
    height = bottom + 20
    return "".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline" class="timeline zoomable" {_size(height)} '
        f'data-duration="{model.duration:.3f}">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#444"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#999" stroke-width="2"/></pattern></defs>',
        f'<g class="zoom">{"".join(layers.zoom)}</g><g class="pin">{"".join(layers.pin)}</g>',
        f'<g class="labels"><rect class="labels-bg" x="0" y="{_TOP - 30}" width="{LABEL_W - 2}" '  # below the times
        f'height="{height - _TOP + 30:g}"/>',
        f'<text class="row-label" x="4" y="{_TOP - 18}">rounds</text>'
        f'<text class="row-label" x="4" y="{_TOP - 5}">faults</text>{"".join(lanes.labels)}</g>',
        "</svg>"]), rows


def _size(height: float) -> str:
    """Drawn at its natural size, shrunk to fit a narrower window (never stretched)."""
    width = LABEL_W + PLOT_W + 20
    return f'width="{width}" height="{height:g}" viewBox="0 0 {width} {height:g}" style="max-width:100%;height:auto"'


def _rank_colour(rank: Any) -> str:
    r = rank if isinstance(rank, int) else hash(rank)
    return f"hsl({(r * 137.508) % 360:.0f},65%,42%)"


def render_steps(model: Model, height: int = 180) -> str:
    """Step progress per rank: one line each, broken where the rank's process changed;
    at most one point per 3 px so a 10-minute job stays small and quick."""
    if not model.steps:
        return '<p class="muted">No step progress: the workers did not call <code>harness.report_step</code>.</p>'
    scale = _Scale(model.duration)
    top, plot_h = 10, height - 30
    k = plot_h / max(model.max_step, 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="steps" class="steps zoomable" {_size(height)}>',
           f'<g class="zoom"><line class="tick" x1="{LABEL_W}" x2="{LABEL_W + PLOT_W}" y1="{top + plot_h}" '
           f'y2="{top + plot_h}"/>']
    for rank in sorted(model.steps, key=lambda r: (not isinstance(r, int), r if isinstance(r, int) else str(r))):
        parts: list[str] = []
        points = model.steps[rank]
        last_x, last_pid, base, kx = -10.0, None, top + plot_h, scale.k
        final = len(points) - 1
        for i, (t, step, pid) in enumerate(points):
            x = LABEL_W + t * kx
            if pid != last_pid:
                parts.append(f"M{x:.1f} {base - step * k:.1f}")
            elif x - last_x >= 3 or i == final or points[i + 1][2] != pid:
                parts.append(f"L{x:.1f} {base - step * k:.1f}")
            else:
                continue
            last_x, last_pid = x, pid
        out.append(f'<path class="step-line" data-rank="{html.escape(str(rank))}" stroke="{_rank_colour(rank)}" '
                   f'd="{"".join(parts)}"><title>rank {html.escape(str(rank))}: up to step '
                   f'{max(s for _, s, _ in points)}</title></path>')
    out.append(f'</g><g class="labels"><rect class="labels-bg" x="0" y="0" width="{LABEL_W - 2}" height="{height}"/>'
               f'<text class="row-label" x="4" y="{top + 10}">step</text>'
               f'<text class="y-label" x="{LABEL_W - 6}" y="{top + 4}">{model.max_step}</text>'
               f'<text class="y-label" x="{LABEL_W - 6}" y="{top + plot_h}">0</text></g></svg>')
    return "".join(out)
