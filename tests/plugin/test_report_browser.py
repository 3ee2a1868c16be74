"""The report in a real browser: headless Chromium (Debian's, installed by ``.ci/run``)
driven over the DevTools protocol on ``--remote-debugging-pipe`` with the stdlib only.

Fails on any console error or uncaught exception; checks that lanes, markers and rounds
are in the DOM, that hovering a lane and clicking a fault show details, that zooming along
time keeps node labels in view and tooltips right, that the index sorts; saves screenshots.
Skipped, saying why, where no Chromium is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.synth import synthetic_events
from pytest_elastic.report.index import COLUMNS, write_index
from pytest_elastic.report.page import write_html
from tests.browser import CHROMIUM, Browser

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (.ci/run installs Debian's)")


def _centre(browser: Browser, selector: str) -> tuple[float, float]:
    box = browser.js(f"(()=>{{const r=document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                     "return [r.x+r.width/2,r.y+r.height/2];})()")
    return box[0], box[1]


def test_page_in_chromium_has_lanes_markers_and_working_details(browser, tmp_path):
    page = tmp_path / "job.html"
    events = synthetic_events(nodes=40, nproc=2, duration=600, faults=100, int_nodes=True)
    write_html(str(page), "40 nodes, 10 minutes, 100 faults", events, nproc=2)
    browser.open(page)
    counts = browser.js("({lanes:document.querySelectorAll('svg#timeline .lane').length,"
                        "markers:document.querySelectorAll('svg#timeline .fault-marker').length,"
                        "rounds:document.querySelectorAll('svg#timeline .round').length,"
                        "dead:document.querySelectorAll('svg#timeline .dead').length,"
                        "steps:document.querySelectorAll('svg#steps .step-line').length,"
                        "legend:!!document.getElementById('legend')})")
    faults = sum(1 for e in events if e["kind"] == "fault" and e["fault"] != "heal")
    assert counts["lanes"] == 40 and counts["markers"] == faults and counts["legend"]
    assert counts["rounds"] > 50 and counts["dead"] >= 1 and counts["steps"] == 80
    x, y = _centre(browser, "svg#timeline .lane rect.row")
    browser.mouse("mouseMoved", x, y)
    tip = browser.js("(()=>{const t=document.getElementById('tip');return [t.style.display,t.textContent];})()")
    assert tip[0] == "block" and "host-00" in tip[1], tip
    x, y = _centre(browser, "svg#timeline .fault-marker")
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert '"fault":' in browser.js("document.getElementById('details').textContent")
    browser.screenshot(tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    x, y = _centre(browser, ".zoomctl button[data-z='8']")
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    zoomed = browser.js("(()=>{const s=document.getElementById('timeline'),b=s.parentNode;b.scrollLeft=3000;"
                        "b.dispatchEvent(new Event('scroll'));return [s.getAttribute('width'),"
                        "s.querySelector('g.labels').getAttribute('transform'),"
                        "s.querySelector('.fault-marker').getAttribute('transform')];})()")
    assert zoomed[0] == str(150 + 1200 * 8 + 20) and zoomed[1].startswith("translate(3000") and zoomed[2], zoomed
    _, y = _centre(browser, "svg#timeline .lane rect.row")
    browser.mouse("mouseMoved", 700, y)  # still a tooltip for what is under the mouse, zoomed and scrolled
    assert "host-00" in browser.js("document.getElementById('tip').textContent")
    browser.screenshot(tmp_path / "report-zoomed.png")
    assert browser.errors() == []


def test_index_in_chromium_sorts_and_links(browser, tmp_path):
    class Settings:
        chaos, seed = True, 7

    stats = [{"elastic_test": f"t.py::test_{n}", "elastic_outcome": outcome, "elastic_fault_count": faults,
              "elastic_faults": "worker_kill", "elastic_restarts": faults, "elastic_detection_latencies": [0.1],
              "elastic_recovery_latencies": [0.3 * faults], "elastic_seed": 7, "elastic_replay": "pytest x",
              "elastic_pages": [f"test_{n}.job0.html"]}
             for n, outcome, faults in (("b", "passed", 3), ("a", "failed", 1), ("c", "passed", 2))]
    index = Path(write_index(str(tmp_path), stats, ["elastic tests: 3"], Settings()))
    browser.open(index)
    first = "document.querySelector('#tests tbody tr td a').textContent"
    assert browser.js(first) == "t.py::test_a"  # failed first
    x, y = _centre(browser, f"th[data-k='{COLUMNS.index('faults')}']")
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert browser.js(first) == "t.py::test_a"  # fewest faults first
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert browser.js(first) == "t.py::test_b"
    browser.screenshot(tmp_path / "index.png")
    assert browser.errors() == []
