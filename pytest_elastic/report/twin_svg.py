"""The job page's twin section: a ``TwinView`` as HTML with one inline SVG per rank.

Per rank, loss (up) over step (along): the twin's curve as a wide grey band, each attempt of
the run as its own coloured line on top (a run the same as its twin sits inside the band;
the steps a resume redid show as the later attempt's line over the earlier one's), a dashed
line where each later attempt resumed (a pale band over the steps it redid), red ticks on the
axis at the steps whose loss differs, and the first divergence ringed with both values. Static
SVG: the page's script only adds tooltips (from each element's ``<title>``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

from harness.sim.truth.golden import EVENT_POINTS
from pytest_elastic.report.legend import legend, shape_item, swatch_item
from pytest_elastic.report.twin import Attempt, Divergence, RankCurves, Resume, TwinView

__all__ = ["render_twin", "TWIN_CSS", "ATTEMPT_COLOURS"]

_W, _H = 960, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 16, 24, 34
_PW, _PH = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
#: one run point per this many px along the step axis at most (a long run's page stays small)
_MIN_DX = 1.5
#: series with at most this many points get a dot per point (a tooltip each)
_DOTS = 60
ATTEMPT_COLOURS = ["#2f6fd6", "#e07b00", "#8e44ad", "#2e9e4f", "#c2185b", "#00838f"]

TWIN_CSS = """
#twin .twin-verdict{font-size:14px;font-weight:600;margin:4px 0}#twin .twin-verdict.same{color:#2e7d32}
#twin .twin-verdict.diverged{color:#c62828}#twin .twin-expected{color:#2e7d32;font-weight:600}
#twin p{margin:3px 0;font-size:13px}#twin .twin-hint{background:#fff8e1;border-left:4px solid #f5c542;padding:4px 8px}
#twin .scroll{margin:6px 0}#twin h3{font-size:13px;margin:12px 0 4px}
svg .twin-curve{fill:none;stroke:#9aa5b1;stroke-width:6;stroke-opacity:.45;stroke-linecap:round;stroke-linejoin:round}
svg .run-curve{fill:none;stroke-width:1.6}svg .run-point{stroke:#fff;stroke-width:.5}
svg .axis{stroke:#c5cad1}svg .grid{stroke:#f0f1f3}svg .x-label{fill:#888;text-anchor:middle}
svg .resume-line{stroke:#6c63ff;stroke-dasharray:4 3}svg .redone{fill:#6c63ff;fill-opacity:.1}
svg .resume-label{fill:#6c63ff;font-size:10px}
svg .differs{stroke:#d62f2f;stroke-width:1.5}
svg .divergence-line{stroke:#d62f2f;stroke-dasharray:2 2}svg .divergence .got{fill:#d62f2f}
svg .divergence .expected{fill:#fff;stroke:#555;stroke-width:1.5}svg .divergence-label{fill:#c62828;font-weight:600}
table.digests td.equal{color:#2e7d32}table.digests td.differ{color:#c62828;font-weight:600}
"""


def _colour(index: int) -> str:
    return ATTEMPT_COLOURS[index % len(ATTEMPT_COLOURS)]


class _Axes:
    """Step along, loss up, over the steps and finite losses both runs have on this rank."""

    def __init__(self, curves: RankCurves):
        steps = [s for s, _ in curves.twin] + [s for a in curves.attempts for s, _ in a.points]
        losses = [v for _, v in curves.twin] + [v for a in curves.attempts for _, v in a.points]
        if curves.first is not None:
            losses += [v for v in (curves.first.got, curves.first.expected) if v is not None]
        finite = [v for v in losses if math.isfinite(v)]
        self.s0, self.s1 = (min(steps), max(steps)) if steps else (0, 1)
        self.lo, self.hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        pad = (self.hi - self.lo) * 0.06 or abs(self.hi) * 0.05 or 0.5
        self.lo, self.hi = self.lo - pad, self.hi + pad

    def x(self, step: int) -> float:
        return _LEFT + (step - self.s0) / max(self.s1 - self.s0, 1) * _PW

    def y(self, loss: float) -> float:
        return _TOP + (self.hi - loss) / (self.hi - self.lo) * _PH


def _path(points: Iterable[tuple[int, float]], axes: _Axes, thin: bool) -> str:
    """An SVG path through the points, broken at non-finite losses; at most one point per
    ``_MIN_DX`` px when ``thin`` (the first and last always kept)."""
    parts: list[str] = []
    pen_up, last_x = True, -1e9
    listed = list(points)
    final = len(listed) - 1
    for i, (step, loss) in enumerate(listed):
        if not math.isfinite(loss):
            pen_up = True
            continue
        x = axes.x(step)
        if thin and not pen_up and i != final and abs(x - last_x) < _MIN_DX:
            continue
        parts.append(f"{'M' if pen_up else 'L'}{x:.1f} {axes.y(loss):.1f}")
        pen_up, last_x = False, x
    return "".join(parts)


def _ticks(s0: int, s1: int, count: int = 8) -> list[int]:
    span = max(s1 - s0, 1)
    raw = span / count
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = max(1, next(m * power for m in (1, 2, 5, 10) if m * power >= raw))
    first = -(-s0 // step) * step
    return list(range(first, s1 + 1, step))


def _axes_svg(axes: _Axes, rank: int) -> list[str]:
    bottom = _TOP + _PH
    out = [f'<text class="row-label" x="4" y="14">rank {rank}</text>',
           f'<text class="y-label" x="{_LEFT - 6}" y="{_TOP + 4}">{axes.hi:.4g}</text>',
           f'<text class="y-label" x="{_LEFT - 6}" y="{bottom}">{axes.lo:.4g}</text>',
           f'<text class="row-label" x="4" y="{_TOP + _PH / 2:.0f}">loss</text>']
    for step in _ticks(axes.s0, axes.s1):
        x = axes.x(step)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{bottom}"/>'
                   f'<text class="x-label" x="{x:.1f}" y="{bottom + 14}">{step}</text>')
    out.append(f'<line class="axis" x1="{_LEFT}" x2="{_LEFT + _PW}" y1="{bottom}" y2="{bottom}"/>'
               f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{bottom}"/>'
               f'<text class="x-label" x="{_LEFT + _PW / 2:.0f}" y="{bottom + 28}">step</text>')
    return out


def _attempt_svg(index: int, attempt: Attempt, rank: int, axes: _Axes, twin: dict[int, float]) -> list[str]:
    """Attempt ``index`` of the rank (0: its first process) as a line, and a dot per step
    when it has few (each with its loss and the twin's in the tooltip)."""
    colour = _colour(index)
    steps = [s for s, _ in attempt.points]
    who = f"rank {rank}, attempt {index}"
    out = [f'<path class="run-curve" data-attempt="{index}" data-restart="{attempt.attempt}" '
           f'data-pid="{attempt.pid}" stroke="{colour}" d="{_path(attempt.points, axes, thin=True)}"><title>{who} '
           f'(restart count {attempt.attempt}, pid {attempt.pid}): steps {min(steps)}–{max(steps)}, '
           f'{len(steps)} losses</title></path>']
    if len(attempt.points) <= _DOTS:
        for step, value in attempt.points:
            if not math.isfinite(value):
                continue
            theirs = twin.get(step)
            against = "" if theirs is None else f", twin {theirs!r}" + (" (same)" if theirs == value else "")
            out.append(f'<circle class="run-point" data-attempt="{index}" data-step="{step}" '
                       f'cx="{axes.x(step):.1f}" cy="{axes.y(value):.1f}" r="2.2" fill="{colour}"><title>{who}, '
                       f'step {step}: loss {value!r}{against}</title></circle>')
    return out


def _rank_svg(curves: RankCurves) -> str:
    axes = _Axes(curves)
    rank = curves.rank
    twin = dict(curves.twin)
    bottom = _TOP + _PH
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="twin-chart" id="twin-rank-{rank}" data-rank="{rank}" '
           f'width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" style="max-width:100%;height:auto">',
           *_axes_svg(axes, rank)]
    if curves.twin:
        out.append(f'<path class="twin-curve" d="{_path(curves.twin, axes, thin=False)}"><title>the fault-free '
                   f'twin, rank {rank}: {len(curves.twin)} losses</title></path>')
    for i, attempt in enumerate(curves.attempts):
        out += _attempt_svg(i, attempt, rank, axes, twin)
    for resume in curves.resumes:
        out.append(_resume_svg(resume, rank, axes))
    if curves.differs:
        ticks = "".join(f"M{axes.x(s):.1f} {bottom - 7}v6" for s in curves.differs)  # above the step labels
        out.append(f'<path class="differs" d="{ticks}"><title>{len(curves.differs)} step(s) whose loss differs '
                   f'from the twin\'s</title></path>')
    if curves.first is not None:
        out.append(_divergence_svg(curves.first, axes))
    out.append("</svg>")
    return "".join(out)


def _resume_svg(resume: Resume, rank: int, axes: _Axes) -> str:
    """A dashed line where the attempt began and, over the steps it did again, a pale band."""
    x = axes.x(resume.step)
    bottom = _TOP + _PH
    redone = ""
    if resume.redone_to is not None:
        x2 = max(axes.x(resume.redone_to), x + 3)
        steps = f"step {resume.step}" if resume.redone_to == resume.step else f"steps {resume.step}–{resume.redone_to}"
        redone = (f'<rect class="redone" x="{x:.1f}" y="{_TOP}" width="{x2 - x:.1f}" height="{_PH}"><title>'
                  f'{steps} redone by attempt {resume.index}</title></rect>')
    restart = f" (restart count {resume.restart_count})"
    return (f'<g class="resume" data-step="{resume.step}" data-attempt="{resume.index}">{redone}'
            f'<line class="resume-line" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP - 8}" y2="{bottom}"/>'
            f'<text class="resume-label" x="{x + 3:.1f}" y="{_TOP - 10}">attempt {resume.index} resumed at step '
            f'{resume.step}</text><title>rank {rank}: attempt {resume.index}{restart} began at step {resume.step}'
            f'{"" if resume.redone_to is None else f", redoing up to step {resume.redone_to}"}</title></g>')


def _divergence_svg(first: Divergence, axes: _Axes) -> str:
    x = axes.x(first.step)
    text = html.escape(f"first divergence: {first.text()}")
    parts = [f'<g class="divergence" data-rank="{first.rank}" data-step="{first.step}">',
             f'<line class="divergence-line" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_TOP + _PH}"/>']
    if first.expected is not None and math.isfinite(first.expected):
        parts.append(f'<circle class="expected" cx="{x:.1f}" cy="{axes.y(first.expected):.1f}" r="5">'
                     f'<title>the twin: {first.expected!r}</title></circle>')
    if first.got is not None and math.isfinite(first.got):
        parts.append(f'<circle class="got" cx="{x:.1f}" cy="{axes.y(first.got):.1f}" r="3.5">'
                     f'<title>this run: {first.got!r}</title></circle>')
    rel = "" if first.rel_diff is None else f" (rel. diff {first.rel_diff:.2e})"
    label = html.escape(f"first divergence, step {first.step}: {_short(first.got)} vs twin "
                        f"{_short(first.expected)}{rel}")
    width = len(label) * 6.7  # monospace 11 px: about this wide; kept inside the plot
    right = x + 6 + width > _LEFT + _PW
    tx = max(x - 6, _LEFT + width) if right else x + 6
    parts.append(f'<text class="divergence-label" x="{tx:.1f}" y="{_TOP + 12}" '
                 f'text-anchor="{"end" if right else "start"}">{label}</text><title>{text}</title></g>')
    return "".join(parts)


def _short(value: float | None) -> str:
    return "missing" if value is None else f"{value:.7g}"


def _legend(view: TwinView) -> str:
    attempts = max((len(r.attempts) for r in view.ranks), default=0)
    items = [swatch_item("background:#9aa5b1;opacity:.6;height:6px", "the fault-free twin")]
    items += [swatch_item(f"background:{_colour(i)};height:3px",
                          f'this run, {"first attempt" if i == 0 else f"attempt {i} (a later worker process)"}')
              for i in range(max(attempts, 1))]
    if any(r.resumes for r in view.ranks):
        items += [shape_item('<line x1="6" x2="6" y1="0" y2="10" stroke="#6c63ff" stroke-dasharray="3 2"/>',
                             "an attempt resumed here"),
                  swatch_item("background:#6c63ff;opacity:.15", "steps it redid")]
    if view.diverged:
        items += [shape_item('<line x1="6" x2="6" y1="3" y2="10" stroke="#d62f2f" stroke-width="2"/>',
                             "loss differs from the twin's"),
                  shape_item('<circle cx="6" cy="5" r="4" fill="#d62f2f"/>',
                             "first divergence: this run (filled), the twin (ring)")]
    return legend(items, "legend twin-legend")


def _digest_table(view: TwinView) -> str:
    if not view.digests:
        return ("<p class='muted twin-digests'>No final state digests: the workers digest their state "
                "(<code>report_step(..., state=...)</code>) only when the job asks for them (golden).</p>")
    rows = "".join(f"<tr data-rank='{d.rank}'><td>{d.rank}</td><td class='mono'>{html.escape((d.run or '–')[:16])}"
                   f"</td><td class='mono'>{html.escape((d.twin or '–')[:16])}</td>"
                   f"<td class='{html.escape(d.verdict.split()[0].strip(':'))}'>{html.escape(d.verdict)}</td></tr>"
                   for d in view.digests)
    return ("<table class='digests'><tr><th>rank</th><th>this run's final state</th><th>the twin's</th>"
            f"<th></th></tr>{rows}</table>")


def render_twin(view: TwinView) -> str:
    """The whole twin section of a job page (heading included)."""
    cls = "diverged" if view.diverged else "same"
    parts = [f"<section id='twin' class='twin {cls}'><h2>Fault-free twin</h2>",
             f"<p class='twin-verdict {cls}'>{html.escape(view.headline)}</p>"]
    if view.expected:
        parts.append("<p class='twin-expected'>caught as expected: the test passed with this divergence "
                     "(it expects one: <code>diverges = true</code>)</p>")
    parts.append(f"<p class='twin-tolerance'>tolerance: {html.escape(view.tolerance)}, because "
                 f"{html.escape(view.why)}</p>")
    if view.first is not None and view.first.attempt is not None:
        where = f", which resumed at step {view.first.resumed_at}" if view.first.resumed_at else ""
        parts.append(f"<p class='twin-where'>reported by the workers of restart {view.first.attempt}"
                     f"{html.escape(where)}</p>")
    if view.note and view.note not in view.why:
        parts.append(f"<p class='twin-note'>{html.escape(view.note)}</p>")
    parts.append(f"<p class='twin-hint'>{'hint' if view.diverged else 'what it would catch'}: "
                 f"{html.escape(view.hint)}</p>")
    source = "from the cache (an earlier run of the same script, args and shape)" if view.cached else \
        "run for this job"
    parts.append(f"<p class='muted'>The twin: the same script, args and cluster shape with no faults, {source}. "
                 "Every report of every attempt is drawn; the oracle judges the last report of each step.</p>")
    if view.capped:
        parts.append(f"<p class='twin-capped muted'>The twin's curve is drawn from {view.twin_points} of its "
                     f"{view.twin_total} losses, evenly spread (the golden event keeps at most {EVENT_POINTS}).</p>")
    elif view.twin_total == 0 and view.steps_compared:
        parts.append("<p class='muted'>The twin's losses are not in this job's events (written by an older "
                     "harness): only this run's curves are drawn.</p>")
    parts.append(_legend(view))
    parts += [f"<div class='scroll'>{_rank_svg(curves)}</div>" for curves in view.ranks]
    if view.hidden_ranks:
        hidden = ", ".join(map(str, view.hidden_ranks[:20])) + (" …" if len(view.hidden_ranks) > 20 else "")
        parts.append(f"<p class='muted'>{len(view.hidden_ranks)} more rank(s) not drawn: {hidden}.</p>")
    parts += ["<h3>Final state digests</h3>", _digest_table(view), "</section>"]
    return "".join(parts)
