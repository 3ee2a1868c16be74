"""The fault-free twin on the report, in a real browser: two bundled training scenarios run
end to end with ``--elastic-report`` (the forgetful lr-scheduler resume the twin must catch,
and a right resume that must equal its twin), then their pages and the index are loaded in
headless Chromium and the drawn comparison is read back from the DOM.

Skipped, saying why, where no Chromium is installed (``test_report_browser.py`` drives it).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CHROMIUM, Browser

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (.ci/run installs Debian's)")
pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy (the test extra installs it)")

TRAINING = Path(__file__).resolve().parents[2] / "scenarios" / "training"
CAUGHT = "forgets_lr_scheduler_is_caught"  # diverges = true: the twin must catch it
CLEAN = "worker_crash_resume_is_golden"  # same_as_golden = true


def _open(browser: Browser, page: Path) -> None:
    """``Browser.open`` waits for a load event among all it has seen: forget the last page's
    (its errors were checked) so this one is waited for."""
    browser.events.clear()
    browser.open(page)


def _js(browser: Browser, expression: str) -> Any:
    return browser.js(f"(()=>{{{expression}}})()")


def _twin_on_page(browser: Browser) -> dict[str, Any]:
    """What the page's twin section shows, read from the DOM the browser built."""
    return _js(browser, """
      const q=s=>document.querySelector(s),all=s=>[...document.querySelectorAll(s)];
      const mark=q('svg.twin-chart g.divergence');
      const box=el=>{if(!el)return null;const r=el.getBoundingClientRect();return [r.width,r.height];};
      return {verdict:q('#twin .twin-verdict')?.textContent, expected:q('#twin .twin-expected')?.textContent||null,
        tolerance:q('#twin .twin-tolerance')?.textContent, hint:q('#twin .twin-hint')?.textContent,
        figure:q('.twin-figure')?.textContent, charts:all('svg.twin-chart').map(s=>s.dataset.rank),
        twinCurves:all('svg.twin-chart path.twin-curve').length,
        attempts:all('svg.twin-chart path.run-curve').map(p=>p.dataset.attempt),
        resumes:all('svg.twin-chart g.resume').map(g=>+g.dataset.step),
        redone:all('svg.twin-chart rect.redone').length,
        mark:mark?{rank:+mark.dataset.rank,step:+mark.dataset.step,label:mark.querySelector('.divergence-label').textContent,
          got:box(mark.querySelector('circle.got')),expected:box(mark.querySelector('circle.expected'))}:null,
        differs:all('svg.twin-chart path.differs').length,
        pointTips:all('svg.twin-chart circle.run-point').map(c=>c.getAttribute('data-tip')),
        digests:all('#twin table.digests tr[data-rank] td:last-child').map(td=>td.textContent)};""")


@pytest.mark.timeout(400)
def test_the_twin_is_drawn_on_each_page_and_its_verdict_in_the_index(pytester: pytest.Pytester,
                                                                      browser: Browser, tmp_path: Path) -> None:
    scenarios = pytester.mkdir("scenarios") / "training"
    scenarios.mkdir()
    for name in (f"{CAUGHT}.toml", f"{CLEAN}.toml", "train.py"):
        shutil.copy(TRAINING / name, scenarios / name)
    result = pytester.runpytest_subprocess("scenarios", "--elastic-report=report", "-p", "no:cacheprovider",
                                           "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    report = pytester.path / "report"
    rows = {r["test"].split("::")[-1]: r for r in json.loads((report / "summary.json").read_text())["results"]}

    _open(browser, report / rows[CAUGHT]["pages"][0])
    caught = _twin_on_page(browser)
    mark = caught["mark"]
    assert mark is not None, caught
    assert caught["verdict"].startswith(f"diverged from its fault-free twin at rank {mark['rank']}, step "
                                        f"{mark['step']}: loss ") and "relative difference" in caught["verdict"]
    assert f"step {mark['step']}: " in mark["label"] and " vs twin " in mark["label"] and "rel. diff" in mark["label"]
    assert mark["got"][0] > 0 and mark["expected"][0] > 0  # both values drawn, not only named
    assert caught["expected"].startswith("caught as expected")
    assert caught["tolerance"].startswith("tolerance: bitwise, because") and "LR scheduler" in caught["hint"]
    assert f"diverged at rank {mark['rank']} step {mark['step']}" in caught["figure"]
    assert caught["charts"] == ["0", "1"] and caught["twinCurves"] == 2 and caught["differs"] >= 1
    assert "1" in caught["attempts"] and caught["resumes"] and caught["redone"] >= 1  # the restart redid steps
    assert "differ" in caught["digests"]
    assert any(" (same)" not in tip for tip in caught["pointTips"])
    browser.screenshot(tmp_path / "caught.png")
    assert browser.errors() == []

    _open(browser, report / rows[CLEAN]["pages"][0])
    clean = _twin_on_page(browser)
    assert re.fullmatch(r"same as its fault-free twin: \d+ \(rank, step\) losses compared, bitwise",
                        clean["verdict"]), clean["verdict"]
    assert clean["mark"] is None and clean["expected"] is None and clean["differs"] == 0
    assert clean["twinCurves"] == len(clean["charts"]) == 2 and clean["resumes"]
    assert clean["pointTips"] and all(tip.endswith(" (same)") for tip in clean["pointTips"])  # on top of each other
    assert clean["digests"] == ["equal", "equal"]
    assert browser.errors() == []

    _open(browser, report / "index.html")
    twin_col = _js(browser, "const h=[...document.querySelectorAll('th[data-k]')];"
                            "return h.findIndex(t=>t.textContent==='fault-free twin');")
    assert twin_col >= 0
    cells = ("return [...document.querySelectorAll('#tests tbody tr')].map(r=>"
             f"[r.cells[0].querySelector('a').textContent.split('::').pop(),r.cells[{twin_col}].textContent]);")
    assert dict(_js(browser, cells)) == {CAUGHT: f"diverged at rank {mark['rank']} step {mark['step']}, as expected",
                                         CLEAN: "same"}
    header = _js(browser, f"const th=document.querySelectorAll('th[data-k]')[{twin_col}];th.scrollIntoView();"
                          "const r=th.getBoundingClientRect();return [r.x+r.width/2,r.y+r.height/2,innerWidth];")
    assert 0 < header[0] < header[2], header  # clicked where a person would: on the header, in view
    for first in (CLEAN, CAUGHT):  # ascending (same before diverged), then descending
        browser.mouse("mousePressed", header[0], header[1])
        browser.mouse("mouseReleased", header[0], header[1])
        assert _js(browser, cells)[0][0] == first
    assert browser.errors() == []
