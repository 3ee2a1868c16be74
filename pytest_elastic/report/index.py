"""The session's pages tied together: ``DIR/index.html`` (sortable) and ``DIR/summary.json``.

Built by the controller at the end of the session from the ``elastic_*`` user properties
every elastic test's teardown report carries (under xdist they travel with the reports),
so it covers the tests every worker ran.
"""

from __future__ import annotations

import html
import json
import os
import statistics
from typing import Any

from harness.sim.schema import event_kind

__all__ = ["index_rows", "write_index", "INDEX", "SUMMARY", "COLUMNS"]

INDEX = "index.html"
SUMMARY = "summary.json"


def _latency(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p95": None, "n": 0}
    from pytest_elastic.report.stats import percentile

    return {"median": round(statistics.median(values), 4), "p95": round(percentile(values, 0.95), 4),
            "n": len(values)}


def _minimal_replay(test: str, schedule: Any, settings: Any) -> str | None:
    """The replay line of a shrunk failure's minimal schedule (JSON in the properties)."""
    if not schedule or settings is None:
        return None
    from pytest_elastic._replay import reproduction_line

    return reproduction_line(test, settings, schedule=str(schedule))


def _twin_column(stats: dict[str, Any], directory: str | None) -> dict[str, Any]:
    """The test's twin verdict (``report.twin.combine_verdicts``): from the head of each of
    its job pages (which also know whether a divergence was expected), else from the one-line
    verdict its properties carry (``elastic_twin``, what the junit XML shows)."""
    from pytest_elastic.report.twin import NOT_COMPARED, combine_verdicts

    jobs = []
    if directory is not None:
        from pytest_elastic.report.page import read_page_summary

        for page in stats.get("elastic_pages", []):
            summary = read_page_summary(os.path.join(directory, str(page)))
            twin = summary.get("twin") if summary else None
            if isinstance(twin, dict):
                jobs.append(twin)
    if jobs:
        return combine_verdicts(jobs)
    given = stats.get("elastic_twin")
    if isinstance(given, str) and given and given != NOT_COMPARED:
        diverged = "diverged" in given
        return {"verdict": given, "diverged": diverged, "order": 2 if diverged else 1}
    return combine_verdicts([])


def index_rows(stats: list[dict[str, Any]], settings: Any = None, directory: str | None = None) -> list[dict[str, Any]]:
    """One row per elastic test (the last report of a test wins: a shrinking re-run's).
    ``directory``: where the test's pages are (the twin's verdict is read from them)."""
    rows: dict[str, dict[str, Any]] = {}
    for s in stats:
        test = s.get("elastic_test")
        if not test:
            continue
        # an older session's retired fault names (worker_kill), in today's spelling
        faults = [event_kind(f) for f in str(s.get("elastic_faults", "")).split("; ") if f]
        rows[test] = {
            "test": test, "outcome": s.get("elastic_outcome", "?"), "jobs": s.get("elastic_jobs", 0),
            "faults": s.get("elastic_fault_count", len(faults)), "fault_kinds": faults,
            "recovered": s.get("elastic_recovered", 0), "restarts": s.get("elastic_restarts", 0),
            "detection_s": _latency(list(s.get("elastic_detection_latencies", []))),
            "recovery_s": _latency(list(s.get("elastic_recovery_latencies", []))),
            "resume_s": _latency(list(s.get("elastic_resume_latencies", []))),
            "goodput": s.get("elastic_goodput"), "lost_s": s.get("elastic_lost", {}),
            "seed": s.get("elastic_seed"), "test_seed": s.get("elastic_test_seed"),
            "replay": s.get("elastic_replay"), "minimal_faults": s.get("elastic_minimal_faults"),
            "minimal_replay": _minimal_replay(test, s.get("elastic_minimal_schedule"), settings),
            "pages": list(s.get("elastic_pages", [])),
            "hosts": s.get("elastic_hosts"),  # per job, node -> host (None: every node ran here)
            "twin": _twin_column(s, directory),
        }
    return sorted(rows.values(), key=lambda r: (r["outcome"] != "failed", r["test"]))


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


_SCRIPT = """
document.querySelectorAll('th[data-k]').forEach((th,col)=>th.addEventListener('click',()=>{
  const body=document.querySelector('#tests tbody'),rows=[...body.rows],down=th.dataset.dir!=='asc';
  document.querySelectorAll('th[data-k]').forEach(h=>delete h.dataset.dir);th.dataset.dir=down?'asc':'desc';
  const key=r=>{const c=r.cells[col];const v=c.dataset.v!==undefined?c.dataset.v:c.textContent;
    const n=parseFloat(v);return isNaN(n)?v.toLowerCase():n;};
  rows.sort((a,b)=>{const x=key(a),y=key(b);return (x<y?-1:x>y?1:0)*(down?1:-1);});
  rows.forEach(r=>body.appendChild(r));}));
"""

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 20px;color:#1d232a}
h1{font-size:19px}table{border-collapse:collapse;font-size:13px}
th{cursor:pointer;text-align:left;background:#f4f5f7;padding:4px 8px;user-select:none;white-space:nowrap}
th[data-dir=asc]::after{content:' ▲'}th[data-dir=desc]::after{content:' ▼'}
td{padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top}
.badge{display:inline-block;padding:0 7px;border-radius:9px;color:#fff;font-weight:600;font-size:12px}
.passed{background:#2e9e4f}.failed{background:#d62f2f}
code{background:#f4f5f7;padding:1px 4px;font-size:11px;user-select:all;word-break:break-all;color:#555}
td div{margin-top:3px}
.summary{margin:8px 0 14px;font-size:13px}.summary div{margin:2px 0}
td.twin.same{color:#2e7d32}td.twin.diverged{color:#c62828;font-weight:600}td.twin.none{color:#888}
"""


def _twin_class(twin: dict[str, Any]) -> str:
    diverged = twin.get("diverged")
    return "none" if diverged is None else "diverged" if diverged else "same"


def _latency_cell(latency: dict[str, float | None]) -> str:
    median = latency["median"]
    return f"<td data-v='{median if median is not None else -1}'>{_ms(median)} / {_ms(latency['p95'])}</td>"


#: the index's columns, in order: what a test proved (outcome, the twin's verdict, goodput,
#: how fast training resumed) before how it got there; ``_row_html`` fills them in this order
COLUMNS = ["test", "outcome", "fault-free twin", "goodput", "training resumed ms (median / p95)", "faults",
           "restarts", "detection ms (median / p95)", "recovery ms (median / p95)", "chaos seed"]


def _row_html(row: dict[str, Any]) -> str:
    pages = row["pages"]
    name = html.escape(row["test"])
    link = f"<a href='{html.escape(pages[0])}'>{name}</a>" if pages else name
    more = (" ".join(f"<a href='{html.escape(p)}'>job {i}</a>" for i, p in enumerate(pages) if i)
            if len(pages) > 1 else "")
    replay = row.get("minimal_replay") or row.get("replay") or ""
    kinds = ", ".join(sorted(set(row["fault_kinds"])))
    goodput = row.get("goodput")
    twin = row["twin"]
    seed = "" if row["seed"] is None else str(row["seed"])
    replay_html = f"<div><code>{html.escape(replay)}</code></div>" if replay else ""
    return (f"<tr><td data-v='{name}'>{link} {more}{replay_html}</td>"
            f"<td data-v='{html.escape(row['outcome'])}'><span class='badge {html.escape(row['outcome'])}'>"
            f"{html.escape(row['outcome'])}</span></td>"
            f"<td class='twin {_twin_class(twin)}' data-v='{twin['order']}'>{html.escape(twin['verdict'])}</td>"
            f"<td data-v='{goodput if goodput is not None else -1}'>"
            f"{'–' if goodput is None else f'{goodput:.2f}'}</td>"
            f"{_latency_cell(row['resume_s'])}"
            f"<td data-v='{row['faults']}' title='{html.escape(kinds)}'>{row['faults']}"
            f"{' (' + html.escape(kinds) + ')' if kinds else ''}</td>"
            f"<td>{row['restarts']}</td>{_latency_cell(row['detection_s'])}{_latency_cell(row['recovery_s'])}"
            f"<td>{html.escape(seed)}</td></tr>")


def write_index(directory: str, stats: list[dict[str, Any]], summary_lines: list[str], settings: Any) -> str:
    """Write ``index.html`` and ``summary.json`` into ``directory``; the index's path."""
    rows = index_rows(stats, settings, directory)
    os.makedirs(directory, exist_ok=True)
    summary = {"chaos": bool(getattr(settings, "chaos", False)), "seed": getattr(settings, "seed", None),
               "tests": len(rows), "failed": sum(1 for r in rows if r["outcome"] == "failed"),
               "faults": sum(r["faults"] for r in rows), "restarts": sum(r["restarts"] for r in rows),
               "detection_s": _latency([v for s in stats for v in s.get("elastic_detection_latencies", [])]),
               "recovery_s": _latency([v for s in stats for v in s.get("elastic_recovery_latencies", [])]),
               "resume_s": _latency([v for s in stats for v in s.get("elastic_resume_latencies", [])]),
               "summary": summary_lines, "results": rows}
    with open(os.path.join(directory, SUMMARY), "w", encoding="utf-8") as fp:
        json.dump(summary, fp, indent=1, default=str)
    head = "".join(f"<div>{html.escape(line)}</div>" for line in summary_lines)
    header = "".join(f"<th data-k='{i}'>{html.escape(c)}</th>" for i, c in enumerate(COLUMNS))
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>elastic report</title>"
            f"<style>{_CSS}</style></head><body><h1>Elastic tests: {len(rows)} "
            f"({summary['failed']} failed)</h1><div class='summary'>{head}</div>"
            f"<p>Click a column to sort; a test's name opens its timeline, the line under it replays it. "
            f"Also as <a href='{SUMMARY}'>"
            f"{SUMMARY}</a>.</p><table id='tests'><thead><tr>{header}</tr></thead><tbody>"
            f"{''.join(_row_html(r) for r in rows)}</tbody></table><script>{_SCRIPT}</script></body></html>")
    path = os.path.join(directory, INDEX)
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(page)
    return path
