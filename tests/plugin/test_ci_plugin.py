"""Where CI looks, end to end: GitHub annotations and step summary, JUnit properties under
``-n 2``, and ``pytest --lf`` replaying a failed chaos test's schedule."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from tests.conftest import SCRIPTS, printed_schedule
from tests.plugin.test_plugin import CHAOS_TEST

STEPPER = str(SCRIPTS / "stepper.py")

TESTS = f"""
import pytest
from harness import WorkerState
from harness.faults import AtStep, WorkerKill

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=1)
def test_recovers(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "20", "0.01")
    job.inject(WorkerKill(node=0, local_rank=1), AtStep(step=3, rank=1))
    assert job.wait(timeout=90).state == WorkerState.SUCCEEDED

@pytest.mark.elastic(nnodes=1, nproc_per_node=2)
def test_wrong(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "5", "0.01")
    job.wait(timeout=90)
    assert job.timeline.world_sizes() == [4], "expected four workers"
"""

SCENARIO = f"""description = "expects a restart that never comes"

[job]
script = {STEPPER!r}
args = ["5", "0.01"]
nnodes = "1"
nproc_per_node = 2

[expect]
state = "SUCCEEDED"
restarts = 1
"""


def _properties(xml_path, test_name: str) -> dict[str, str]:
    root = ET.parse(xml_path).getroot()
    case = next(c for c in root.iter("testcase") if c.get("name") == test_name)
    return {p.get("name"): p.get("value") for p in case.iter("property")}


def test_github_annotations_summary_and_junit_properties_under_xdist(pytester, monkeypatch):
    pytester.makepyfile(test_ci=TESTS)
    scen = pytester.mkdir("scenarios")
    (scen / "wrong.toml").write_text(SCENARIO)
    summary = pytester.path / "summary.md"
    summary.write_text("## an earlier step\n")
    monkeypatch.delenv("PYTEST_ELASTIC_GITHUB")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--junitxml=out.xml", "test_ci.py", "scenarios")
    result.assert_outcomes(passed=1, failed=2)
    # the test's first line: its decorator (where Python's code object says it starts)
    def_line = (pytester.path / "test_ci.py").read_text().splitlines().index("def test_wrong(elastic_cluster):")
    expect_line = SCENARIO.splitlines().index("[expect]") + 1
    result.stdout.fnmatch_lines_random([
        f"::error file=test_ci.py,line={def_line},title=elastic%3A test_ci.py%3A%3Atest_wrong::"
        "AssertionError: expected four workers",
        f"::error file=scenarios/wrong.toml,line={expect_line},title=elastic%3A scenarios/wrong.toml%3A%3Awrong::"
        "*restart*expected 1*",
        f"elastic summary appended to {summary}",
    ])
    assert "test_recovers::" not in result.stdout.str()  # no annotation for the test that passed
    text = summary.read_text()
    assert text.startswith("## an earlier step\n### pytest-elastic")
    assert "| 3 | 2 | 1 |" in text
    assert "**Failed:** `test_ci.py::test_wrong`: AssertionError: expected four workers" in text
    assert "```\npytest 'test_ci.py::test_wrong'\n```" in text
    # JUnit: the figures as properties of each testcase, carried over from the xdist workers
    ok = _properties(pytester.path / "out.xml", "test_recovers")
    assert ok["elastic_twin"] == "not compared"
    assert ok["elastic_replay"] == "pytest 'test_ci.py::test_recovers'"
    assert ok["elastic_outcome"] == "passed" and 0 < float(ok["elastic_goodput"]) <= 1
    assert len(json.loads(ok["elastic_resume_latencies"])) == 1
    bad = _properties(pytester.path / "out.xml", "test_wrong")
    assert bad["elastic_cause"] == "AssertionError: expected four workers"
    assert bad["elastic_where"] == f"test_ci.py:{def_line}"


def test_lf_replays_the_failed_chaos_schedule_and_forgets_it_once_it_passes(pytester, monkeypatch):
    pytester.makepyfile(test_lf=CHAOS_TEST)  # test_survives passes, test_too_fragile fails
    monkeypatch.setenv("PYTEST_ELASTIC_SHRINK_BUDGET", "0")
    first = pytester.runpytest_subprocess("--elastic-chaos", "--elastic-seed=11")
    first.assert_outcomes(passed=1, failed=1)
    cache = pytester.path / ".pytest_cache" / "v" / "elastic" / "lastfailed"
    assert json.loads(cache.read_text())["test_lf.py::test_too_fragile"]["seed"] == 11
    # a plain --lf, as after a fix: no chaos flag, yet the same faults, and it says so
    again = pytester.runpytest_subprocess("--lf")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines([
        "elastic: --lf replays the last failure's chaos schedule of 1 test(s) (seed 11; *",
        "replayed from the last failure (pytest --lf)*",
        "  pytest 'test_lf.py::test_too_fragile' --elastic-chaos --elastic-seed=11 --elastic-schedule='[[][[]{*}]]'",
    ])
    assert printed_schedule(first) and printed_schedule(again) == printed_schedule(first)
    # fixed: the replay passes, and the entry is forgotten
    pytester.makepyfile(test_lf=CHAOS_TEST.replace('assert job.timeline.faults() == [], "a fault happened"', "pass"))
    fixed = pytester.runpytest_subprocess("--lf")
    fixed.assert_outcomes(passed=1)
    fixed.stdout.fnmatch_lines(["elastic: --lf replays the last failure's chaos schedule of 1 test(s)*"])
    assert json.loads(cache.read_text()) == {}  # nothing left to replay
