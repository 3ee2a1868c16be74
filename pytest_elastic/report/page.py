"""One test's page: header figures, failures first, the drawn timeline, steps, legend, tables.

Self-contained (inline CSS, SVG and a small script; nothing fetched), so it opens from a CI
artifact. The script only adds tooltips and click-to-pin details: the drawing is static SVG.
"""

from __future__ import annotations

import html
import json
import re
import statistics
from typing import Any

from pytest_elastic.report.chart import draw_chart
from pytest_elastic.report.legend import legend, shape_item, swatch_item
from pytest_elastic.report.model import Model, build_model, events_of, fault_text
from pytest_elastic.report.svg import (
    LABEL_W,
    LOST_COLOURS,
    PLOT_W,
    STATE_COLOURS,
    WORKER_COLOURS,
    render_steps,
    render_timeline,
)
from pytest_elastic.report.twin import TwinView, twin_summary, twin_view
from pytest_elastic.report.twin_svg import TWIN_CSS, render_twin

__all__ = ["write_html", "build_page", "page_figures", "read_page_summary", "EVENT_ROWS_LIMIT", "SUMMARY_ID"]

#: the raw event table keeps the first events of a long job (the page stays small)
EVENT_ROWS_LIMIT = 1500
_SKIP = ("ts", "mono", "node", "pid", "run_id", "kind")
#: the page's own figures as JSON, first thing in its head: the session index reads them from
#: the page (the twin's verdict is not among a test's junit properties)
SUMMARY_ID = "elastic-page-summary"
_SUMMARY_BYTES = 16384

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 20px;color:#1d232a;background:#fff}
h1{font-size:19px;margin:0 0 6px;word-break:break-all}h2{font-size:15px;margin:18px 0 6px}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;color:#fff;font-weight:600;font-size:13px}
.SUCCEEDED,.passed{background:#2e9e4f}.FAILED,.failed{background:#d62f2f}.unfinished,.skipped{background:#888}
.figures{display:flex;flex-wrap:wrap;gap:6px 22px;margin:8px 0;font-size:13px}.figures b{font-size:15px}
pre{background:#f4f5f7;padding:8px 10px;overflow:auto;font-size:12px;line-height:1.35}
pre.failure{background:#fff1f0;border-left:4px solid #d62f2f}
code.replay{background:#f4f5f7;padding:2px 6px;font-size:12px;user-select:all}
.scroll{overflow-x:auto;border:1px solid #e3e6ea;border-radius:4px}
svg text{font-size:11px;font-family:ui-monospace,Menlo,Consolas,monospace;fill:#333}
svg .label,svg .y-label{text-anchor:end}svg .labels-bg{fill:#fff}
svg .zoom line,svg .step-line{vector-effect:non-scaling-stroke}svg:not(.zoomed) .minor{display:none}
.zoomctl{font-size:12px;margin:4px 0}.zoomctl button{font-size:12px;padding:1px 7px;margin-left:3px;cursor:pointer;
border:1px solid #c5cad1;background:#fff;border-radius:3px}.zoomctl button.on{background:#1d232a;color:#fff}
svg .row-label{fill:#777}svg .tick{stroke:#e9ecef}svg .tick-label{fill:#888;text-anchor:middle}
svg .row{fill:transparent}svg .st,svg .wk{pointer-events:none}
svg .round-line{stroke:#6c63ff;stroke-dasharray:2 3;stroke-width:1;pointer-events:none}svg .round-label{fill:#6c63ff;font-size:10px}
svg .round-hit{fill:#6c63ff}
svg .fault-line{stroke:#d62f2f;stroke-opacity:.22;pointer-events:none}svg .fault-end{fill:#2e9e4f;cursor:pointer}
svg .fault-marker{fill:#d62f2f;stroke:#fff;stroke-width:.5;cursor:pointer}
svg .fault-span{fill:#d62f2f;fill-opacity:.55;cursor:pointer}
svg .fault-span.on-lane{fill:url(#hatch);fill-opacity:.25;stroke:#d62f2f;stroke-width:1}
span.lostbar{display:inline-flex;width:100px;height:9px;background:#eee;vertical-align:middle}span.lostbar i{display:block;height:9px}
svg .detect{fill:#f08c00;fill-opacity:.18;pointer-events:none}svg .recover{fill:#f5c542;fill-opacity:.16;pointer-events:none}
svg .dead{fill:url(#hatch);fill-opacity:.8}svg .dead.left{fill-opacity:.35}svg .dead-label{fill:#fff;font-weight:600;pointer-events:none}
svg .step-line{fill:none;stroke-width:1.2;stroke-opacity:.85}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:6px 0}
.legend span{display:inline-flex;align-items:center;gap:4px}.sw{display:inline-block;width:14px;height:10px;border-radius:2px}
#tip{position:fixed;pointer-events:none;background:#1d232a;color:#fff;font-size:12px;padding:4px 7px;border-radius:4px;
max-width:520px;display:none;z-index:9;white-space:pre-wrap}
#details{min-height:1.5em}
table{border-collapse:collapse;font-size:12px}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
td.mono{font-family:ui-monospace,Menlo,Consolas,monospace}.muted{color:#888}
"""

_JS = """
(function(){
const ROWS=JSON.parse(document.getElementById('rows-data').textContent);
const FAULTS=JSON.parse(document.getElementById('faults-data').textContent);
const tip=document.getElementById('tip'),details=document.getElementById('details');
const NAMES={ok:'exited 0',stopped:'stopped by its agent',failed:'failed',running:'running at the end (or until its node died)'};
document.querySelectorAll('svg title').forEach(t=>{t.parentNode.setAttribute('data-tip',t.textContent);t.remove();});
let ZOOM=1;
function timeAt(svg,ev){const p=svg.createSVGPoint();p.x=ev.clientX;p.y=ev.clientY;
  const q=p.matrixTransform(svg.getScreenCTM().inverse());return (q.x-LABEL_W)*DURATION/(PLOT_W*ZOOM);}
function find(spans,t){let lo=0,hi=spans.length-1,best=null;while(lo<=hi){const m=(lo+hi)>>1;
  if(spans[m][0]<=t){best=m;lo=m+1;}else hi=m-1;}
  if(best===null)return null;const s=spans[best];return t<=s[1]+DURATION/(PLOT_W*ZOOM)?s:null;}
function stick(box){const svg=box.querySelector('svg.zoomable');if(!svg)return;
  const k=svg.viewBox.baseVal.width/svg.getBoundingClientRect().width;
  svg.querySelectorAll('g.labels').forEach(g=>g.setAttribute('transform','translate('+(box.scrollLeft*k)+',0)'));}
function setZoom(z){
  const boxes=[...document.querySelectorAll('.scroll')];
  const centre=boxes.map(b=>(b.scrollLeft+b.clientWidth/2)/b.scrollWidth);ZOOM=z;
  document.querySelectorAll('svg.zoomable').forEach(svg=>{
    const w=LABEL_W+PLOT_W*z+20,h=svg.getAttribute('height');
    svg.setAttribute('width',w);svg.setAttribute('viewBox','0 0 '+w+' '+h);svg.style.maxWidth=z>1?'none':'100%';
    svg.classList.toggle('zoomed',z>=4);
    svg.querySelectorAll('g.zoom').forEach(g=>g.setAttribute('transform','matrix('+z+',0,0,1,'+LABEL_W*(1-z)+',0)'));
    svg.querySelectorAll('g.pin > [data-x]').forEach(el=>
      el.setAttribute('transform','translate('+(el.getAttribute('data-x')-LABEL_W)*(z-1)+',0)'));});
  boxes.forEach((b,i)=>{b.scrollLeft=centre[i]*b.scrollWidth-b.clientWidth/2;stick(b);});
  document.querySelectorAll('.zoomctl button').forEach(b=>b.classList.toggle('on',+b.dataset.z===z));}
document.querySelectorAll('.zoomctl button').forEach(b=>b.addEventListener('click',()=>setZoom(+b.dataset.z)));
document.querySelectorAll('.scroll').forEach(b=>b.addEventListener('scroll',()=>stick(b)));
function fmt(row,s){const when=s[0].toFixed(3)+'s \\u2192 '+s[1].toFixed(3)+'s';
  if(row.kind==='state')return row.node+': '+s[2]+' (round '+s[3]+', restart '+s[4]+')\\n'+when;
  return row.node+' local rank '+row.local_rank+': rank '+s[3]+', pid '+s[5]+', round '+s[7]+
    '\\n'+(NAMES[s[2]]||s[2])+(s[6]===null||s[6]===undefined?'':' (exit '+s[6]+')')+'\\n'+when;}
function describe(el,ev){
  if(el.dataset.row!==undefined){const svg=el.ownerSVGElement,row=ROWS[+el.dataset.row],s=find(row.spans,timeAt(svg,ev));
    return s?fmt(row,s):null;}
  const tipped=el.closest('[data-tip]');return tipped?tipped.getAttribute('data-tip'):null;}
document.querySelectorAll('svg').forEach(svg=>{
  svg.addEventListener('mousemove',ev=>{const text=describe(ev.target,ev);
    if(!text){tip.style.display='none';return;}tip.textContent=text;tip.style.display='block';
    tip.style.left=Math.min(ev.clientX+14,window.innerWidth-540)+'px';tip.style.top=(ev.clientY+14)+'px';});
  svg.addEventListener('mouseleave',()=>{tip.style.display='none';});
  svg.addEventListener('click',ev=>{const el=ev.target;let text=describe(el,ev);
    const f=el.closest('[data-f]');if(f)text=JSON.stringify(FAULTS[+f.dataset.f],null,1);
    if(text)details.textContent=text;});
});
})();
"""


def _colour_css() -> str:
    rules = [f"svg .st-{name}{{fill:{colour}}}" for name, colour in STATE_COLOURS.items()]
    rules += [f"svg .wk-{name}{{fill:{colour}}}" for name, colour in WORKER_COLOURS.items()]
    return "svg .st{fill:#8e44ad}" + "".join(rules)  # unknown states (a terminal entry): purple


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms" if values else "–"


def page_figures(model: Model) -> dict[str, Any]:
    """The numbers the page header and the session index share."""
    detection = [f.detection for f in model.faults if f.detection is not None]
    recovery = [f.recovery for f in model.faults if f.recovery is not None]
    return {"outcome": model.outcome, "nodes": len(model.lanes), "duration_s": round(model.duration, 3),
            "faults": [f.kind for f in model.faults], "rounds": len(model.rounds),
            "world_sizes": [r.world_size for r in model.rounds], "detection_s": detection,
            "recovery_s": recovery, "resume_s": [f.resume for f in model.faults if f.resume is not None],
            "max_step": model.max_step}


def _legend() -> str:
    items = [swatch_item(f"background:{c}", html.escape(s)) for s, c in STATE_COLOURS.items()]
    items += [swatch_item(f"background:{c};height:5px", f"worker {html.escape(n)}") for n, c in WORKER_COLOURS.items()]
    items += [shape_item('<path d="M6 10l-5 -9h10z" fill="#d62f2f"/>', "fault"),
              swatch_item("background:#d62f2f;opacity:.55", "lasting fault (partition, freeze, ...)"),
              swatch_item("background:rgba(240,140,0,.35)", "fault → detected"),
              swatch_item("background:rgba(245,197,66,.35)", "detected → recovered"),
              swatch_item("background:repeating-linear-gradient(45deg,#444 0 3px,#999 3px 5px)",
                          "node dead (killed by the harness; paler: left)"),
              shape_item('<path d="M6 1l-5 9h10z" fill="#2e9e4f"/>', "heal (a lasting fault ended)"),
              shape_item('<line x1="6" x2="6" y1="0" y2="10" stroke="#6c63ff" stroke-dasharray="2 2"/>',
                         "rendezvous round (ws = world size)")]
    return legend(items, ident="legend")


def _fault_table(model: Model) -> str:
    if not model.faults:
        return '<p class="muted">No faults were injected into this job.</p>'
    rows = []
    for i, f in enumerate(model.faults):
        det = f"{f.detection * 1000:.0f} ms" if f.detection is not None else "–"
        rec = f"{f.recovery * 1000:.0f} ms" if f.recovery is not None else "–"
        res = f"{f.resume * 1000:.0f} ms" if f.resume is not None else "–"
        until = f"{f.end:.3f}s" if f.end is not None and f.end > f.at else ""
        rows.append(f'<tr data-f="{i}"><td>{f.at:.3f}s</td><td>{html.escape(f.kind)}</td>'
                    f'<td>{html.escape(str(f.target)) if f.target is not None else ""}</td><td>{until}</td>'
                    f'<td>{det}</td><td>{rec}</td><td>{res}</td><td>{_lost_bar(f.lost)}</td>'
                    f'<td class="mono">{html.escape(fault_text(f))}</td></tr>')
    return ("<table class='faults'><tr><th>at</th><th>fault</th><th>target</th><th>until</th>"
            "<th>detected</th><th>recovered</th><th>training resumed</th><th>time lost</th>"
            f"<th>details</th></tr>{''.join(rows)}</table>")


def _lost_bar(lost: dict[str, float]) -> str:
    """A fault's lost seconds as one stacked bar (100 px = the largest of its parts' sum)."""
    total = sum(lost.values())
    if total <= 0:
        return "–"
    parts = "".join(f'<i class="lost-{k}" style="width:{100 * v / total:.1f}%;background:{LOST_COLOURS[k]}" '
                    f'title="{k} {v * 1000:.0f} ms"></i>' for k, v in lost.items() if v > 0 and k in LOST_COLOURS)
    return f'<span class="lostbar" title="{total:.2f} s lost">{parts}</span> {total:.2f} s'



def _event_table(events: list[dict[str, Any]], t0: float) -> str:
    shown = [e for e in events if e.get("kind") != "step"][:EVENT_ROWS_LIMIT]
    rows = "".join(
        f"<tr><td>{e.get('mono', t0) - t0:.3f}</td><td>{html.escape(str(e.get('node')))}</td>"
        f"<td>{html.escape(str(e.get('kind')))}</td><td class='mono'>"
        f"{html.escape(json.dumps({k: v for k, v in e.items() if k not in _SKIP}, default=str))}</td></tr>"
        for e in shown)
    steps = sum(1 for e in events if e.get("kind") == "step")
    note = f"{len(shown)} of {len(events) - steps} events (step events are drawn above, not listed)"
    return (f"<details><summary>Every event ({note})</summary><table><tr><th>t (s)</th><th>node</th>"
            f"<th>kind</th><th>fields</th></tr>{rows}</table></details>")


def _json_script(element_id: str, value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def build_page(title: str, model: Model, events: list[dict[str, Any]], *, nproc: int = 0,
               info: dict[str, Any] | None = None, failures: str = "", chart: str = "", extra: str = "") -> str:
    """``info``: outcome (of the test), seed, replay line, index link; ``failures``: the
    per-rank explanation (shown first when the test failed)."""
    info = info or {}
    timeline_svg, rows = render_timeline(model, nproc)
    figures = page_figures(model)
    outcome = str(info.get("outcome") or model.outcome)
    twin = _twin(events, info)
    restarts = info.get("restarts")
    replay = info.get("replay")
    head = [f'<span><span class="badge {html.escape(outcome)}">{html.escape(outcome)}</span></span>',
            f'<span>job <b>{html.escape(model.outcome)}</b></span>',
            f"<span><b>{figures['nodes']}</b> nodes</span>",
            f"<span><b>{model.duration:.1f}</b> s</span>",
            f"<span><b>{len(model.faults)}</b> faults</span>",
            f"<span><b>{figures['rounds']}</b> rendezvous rounds "
            f"(world sizes {html.escape(_sizes(figures['world_sizes']))})</span>",
            f"<span>detection median <b>{_median_ms(figures['detection_s'])}</b></span>",
            f"<span>recovery median <b>{_median_ms(figures['recovery_s'])}</b></span>",
            f"<span>training resumed median <b>{_median_ms(figures['resume_s'])}</b></span>"]
    goodput = info.get("goodput")
    if goodput:
        head.append(f"<span class='goodput'>{html.escape(goodput)}</span>")
    if info.get("step_rates"):  # per rank: a straggler stands out (harness.sim.truth.training.rank_rates)
        head.append(f"<span class='rates'>{html.escape(info['step_rates']).replace(chr(10), '<br>')}</span>")
    if restarts is not None:
        head.insert(4, f"<span><b>{restarts}</b> restarts</span>")
    if info.get("seed") is not None:
        head.append(f"<span>chaos seed <b>{html.escape(str(info['seed']))}</b></span>")
    if twin is not None:
        head.append(f"<span class='twin-figure'>fault-free twin: <a href='#twin'><b>{html.escape(twin.verdict)}</b>"
                    f"</a>{', caught as expected' if twin.expected else ''}</span>")
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             _json_script(SUMMARY_ID, {"twin": twin_summary(twin)}),
             f"<style>{_CSS}{TWIN_CSS}{_colour_css()}</style></head><body>",
             (f"<p><a href='{html.escape(info['index'])}'>← all tests</a></p>" if info.get("index") else ""),
             f"<h1>{html.escape(title)}</h1><div class='figures'>{''.join(head)}</div>"]
    if replay:
        parts.append(f"<p>Reproduce: <code class='replay'>{html.escape(replay)}</code></p>")
    left_out = info.get("chaos_left_out") or {}
    if left_out:
        kinds = "".join(f"<li><b>{html.escape(str(kind))}</b>: {html.escape(str(why))}</li>"
                        for kind, why in left_out.items())
        parts.append(f"<h2>Chaos left out</h2><p class='muted'>kinds this job cannot survive as configured "
                     f"(docs/chaos.md)</p><ul class='left-out'>{kinds}</ul>")
    if failures and outcome in ("failed", "FAILED"):
        parts.append(f"<h2>Why it failed</h2><pre class='failure' id='failures'>{html.escape(failures)}</pre>")
    elif failures:
        parts.append(f"<h2>Worker failures it recovered from</h2><pre id='failures'>{html.escape(failures)}</pre>")
    if extra:
        parts.append(f"<pre class='failure'>{html.escape(extra)}</pre>")
    zoom = "".join(f"<button data-z='{z}'{' class=on' if z == 1 else ''}>{z}×</button>" for z in (1, 2, 4, 8, 16))
    parts += ["<h2>Timeline</h2>", _legend(), f"<div class='zoomctl'>zoom along time:{zoom}</div>",
              f"<div class='scroll'>{timeline_svg}</div>",
              "<p class='muted'>Hover for details; click to pin them below.</p><pre id='details'></pre>",
              "<h2>Step progress per rank</h2>", f"<div class='scroll'>{render_steps(model)}</div>"]
    if twin is not None:
        parts.append(render_twin(twin))
    parts += ["<h2>Faults</h2>", _fault_table(model)]
    if chart:
        parts.append(f"<details><summary>Text chart</summary><pre>{html.escape(chart)}</pre></details>")
    parts.append(_event_table(events, model.t0))
    parts += ["<div id='tip'></div>", _json_script("rows-data", rows),
              _json_script("faults-data", [f.event for f in model.faults]),
              f"<script>const LABEL_W={LABEL_W},PLOT_W={PLOT_W},DURATION={model.duration:.6f};{_JS}</script>",
              "</body></html>"]
    return "".join(parts)


def _twin(events: list[dict[str, Any]], info: dict[str, Any]) -> TwinView | None:
    """The twin's view, if the job ran its twin; the test's outcome says whether a
    divergence was expected (a test that passed with one expected it)."""
    outcome = info.get("outcome")
    return twin_view(events, test_passed=None if outcome is None else outcome == "passed")


def read_page_summary(path: str) -> dict[str, Any] | None:
    """The figures a page wrote into its head (``SUMMARY_ID``), read from its first bytes
    only (pages run to megabytes); None for a page without them or one not there."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            start = fp.read(_SUMMARY_BYTES)
    except OSError:
        return None
    found = re.search(f'<script type="application/json" id="{SUMMARY_ID}">(.*?)</script>', start, re.S)
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))  # "<\/" (how _json_script hides "</") is JSON's own escape
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _sizes(sizes: list[Any]) -> str:
    if len(sizes) > 12:
        return " → ".join(map(str, sizes[:6])) + f" → … ({len(sizes) - 9} more) → " + " → ".join(map(str, sizes[-3:]))
    return " → ".join(map(str, sizes)) or "none"


def write_html(path: str, title: str, timeline: Any, extra: str = "", *, info: dict[str, Any] | None = None,
               failures: str = "", nproc: int = 0) -> dict[str, Any]:
    """A self-contained HTML page for one job at ``path``; returns its figures for the
    session index."""
    events, label = events_of(timeline)
    model = build_model(events, label)
    page = build_page(title, model, events, nproc=nproc, info=info, failures=failures,
                      chart=draw_chart(model, width=100), extra=extra)
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(page)
    return {**page_figures(model), "twin": twin_summary(_twin(events, info or {}))}
