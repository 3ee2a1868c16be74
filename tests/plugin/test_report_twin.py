"""The twin on the written pages and the session index: pages written by ``write_html`` from
event lists the real oracle judged, the index built from them as the plugin builds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pytest_elastic._settings import Settings
from pytest_elastic.report.index import write_index
from pytest_elastic.report.page import read_page_summary, write_html
from tests.unit.test_report_twin import CLEAN, TWIN, diverging, golden


def _stats(test: str, outcome: str, pages: list[str], **extra: object) -> dict[str, object]:
    return {"elastic_test": test, "elastic_outcome": outcome, "elastic_fault_count": 1, "elastic_faults": "worker_kill",
            "elastic_restarts": 1, "elastic_resume_latencies": [1.5], "elastic_goodput": 0.5,
            "elastic_pages": pages, **extra}


def _cells(index: str, column: str) -> dict[str, tuple[str, str]]:
    """test -> (data-v, text) of ``column`` in the index's table."""
    header = re.findall(r"<th data-k='(\d+)'>([^<]*)</th>", index)
    col = next(int(k) for k, name in header if name == column)
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", index.split("<tbody>")[1], re.S):
        cells = re.findall(r"<td([^>]*)>(.*?)</td>", row, re.S)
        name = re.sub(r"<[^>]+>", "", cells[0][1]).split()[0]
        value = re.search(r"data-v='([^']*)'", cells[col][0])
        found[name] = (value.group(1) if value else "", re.sub(r"<[^>]+>", "", cells[col][1]))
    return found


def test_pages_carry_the_twin_and_the_index_has_its_verdict_goodput_and_resume_columns(tmp_path: Path):
    _, bad = golden(diverging(), TWIN)
    _, good = golden(CLEAN, TWIN)
    pages = {"caught": [*diverging(), bad], "clean": [*CLEAN, good], "plain": CLEAN}
    for name, events in pages.items():
        figures = write_html(str(tmp_path / f"{name}.html"), name, events, info={"outcome": "passed"})
        summary = read_page_summary(str(tmp_path / f"{name}.html"))
        assert summary is not None and figures["twin"] == summary["twin"]
    caught = (tmp_path / "caught.html").read_text()
    assert "id='twin'" in caught and "caught as expected" in caught and 'class="divergence"' in caught
    assert "fault-free twin: <a href='#twin'><b>diverged at rank 0 step 6</b></a>, caught as expected" in caught
    clean = (tmp_path / "clean.html").read_text()
    assert "same as its fault-free twin: 20 (rank, step) losses compared, bitwise" in clean
    assert 'class="divergence"' not in clean and "caught as expected" not in clean
    assert "id='twin'" not in (tmp_path / "plain.html").read_text()  # no twin, no section

    stats = [_stats("t.py::test_caught", "passed", ["caught.html"]),
             _stats("t.py::test_clean", "passed", ["plain.html", "clean.html"], elastic_goodput=0.9),
             _stats("t.py::test_plain", "failed", ["plain.html"], elastic_goodput=None),
             _stats("t.py::test_given", "passed", ["missing.html"], elastic_twin="diverged at rank 2 step 9"),
             _stats("t.py::test_paged", "passed", ["clean.html"], elastic_twin="diverged at rank 2 step 9")]
    index = Path(write_index(str(tmp_path), stats, ["elastic tests: 5"], Settings())).read_text()
    assert _cells(index, "fault-free twin") == {
        "t.py::test_plain": ("0", "not compared"), "t.py::test_caught": ("2", "diverged at rank 0 step 6, as expected"),
        "t.py::test_clean": ("1", "same"), "t.py::test_given": ("2", "diverged at rank 2 step 9"),  # no page
        "t.py::test_paged": ("1", "same")}  # the page, which knows more, wins
    assert _cells(index, "goodput")["t.py::test_clean"] == ("0.9", "0.90")
    assert _cells(index, "goodput")["t.py::test_plain"] == ("-1", "–")
    assert _cells(index, "training resumed ms (median / p95)")["t.py::test_caught"] == ("1.5", "1500 / 1500")
    rows = {r["test"]: r for r in json.loads((tmp_path / "summary.json").read_text())["results"]}
    assert rows["t.py::test_clean"]["twin"] == {"verdict": "same", "diverged": False, "order": 1}
