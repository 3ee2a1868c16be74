"""``--elastic-report`` end to end (pytester, subprocesses): a failing test explains itself,
every test gets a page, the session an index and summary.json; without the option the
report code is never even imported."""

from __future__ import annotations

import json

from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")
RAISER = """
import os
from harness import report_step
from harness.errors import record

def inner():
    raise ValueError("boom at step 4")

@record
def main():
    for step in range(5):
        report_step(step)
    if os.environ["RANK"] == "1":
        inner()

main()
"""
TESTS = f"""
import pytest
from harness import WorkerState
from harness.faults import WorkerKill, OnState

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=1)
def test_recovers(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "20", "0.02")
    job.inject(WorkerKill(local_rank=1), OnState(WorkerState.HEALTHY))
    assert job.wait(timeout=60).state == WorkerState.SUCCEEDED

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=0)
def test_fails(elastic_cluster):
    job = elastic_cluster.launch("raiser.py")
    assert job.wait(timeout=60).state == WorkerState.SUCCEEDED
"""
PROBE = """
import sys
def pytest_sessionfinish(session):
    # every elastic test's junit properties need report.stats; nothing else of the package
    loaded = sorted(m for m in sys.modules
                    if m.startswith("pytest_elastic.report.") and m != "pytest_elastic.report.stats")
    open("loaded.txt", "w").write(" ".join(loaded))
"""


#: what a failing job's section starts with: the failed rank and its traceback, first
ROOT_CAUSE_LINES = [
    "*elastic failures (job 0*",
    "root cause (first observed failure):",
    "  rank 1 (local rank 1) on node *: exit code 1, pid *",
    "    ValueError: boom at step 4",
    "      Traceback (most recent call last):",
]

def test_report_dir_has_pages_index_and_failures_that_explain_themselves(pytester):
    pytester.makepyfile(raiser=RAISER, test_jobs=TESTS)
    result = pytester.runpytest_subprocess("--elastic-report=report", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        *ROOT_CAUSE_LINES,
        "*elastic timeline (job 0*",
        "legend: *",
        "reproduce with:",
        "  pytest 'test_jobs.py::test_fails'",
    ])
    assert "ValueError: boom at step 4" in result.stdout.str().split("elastic timeline (job 0")[0]
    report = pytester.path / "report"
    summary = json.loads((report / "summary.json").read_text())
    rows = {r["test"]: r for r in summary["results"]}
    assert set(rows) == {"test_jobs.py::test_recovers", "test_jobs.py::test_fails"}
    assert rows["test_jobs.py::test_fails"]["outcome"] == "failed"
    assert rows["test_jobs.py::test_recovers"]["faults"] == 1 and rows["test_jobs.py::test_recovers"]["restarts"] == 1
    assert summary["tests"] == 2 and summary["failed"] == 1
    index = (report / "index.html").read_text()
    for row in rows.values():
        (page,) = row["pages"]
        assert f"href='{page}'" in index and (report / page).is_file()
    failed_page = (report / rows["test_jobs.py::test_fails"]["pages"][0]).read_text()
    assert "Why it failed" in failed_page and "boom at step 4" in failed_page and 'id="timeline"' in failed_page
    result.stdout.fnmatch_lines(["elastic report: *report/index.html"])


def test_without_the_option_the_report_does_no_work(pytester):
    pytester.makeconftest(PROBE)
    pytester.makepyfile(test_jobs=TESTS.split("@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=0)")[0])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "loaded.txt").read_text() == ""
    assert not list(pytester.path.rglob("*.html")) and not list(pytester.path.rglob("summary.json"))


SCENARIO = """
description = "rank 1 raises under @record"
[job]
script = "../raiser.py"
nnodes = "1"
nproc_per_node = 2
max_restarts = 0
[expect]
state = "SUCCEEDED"
"""


def test_a_failing_scenario_shows_its_ranks_traceback(pytester):
    """A scenario closes its cluster (and its error files) inside the test: it must read
    the failures first, or its report has an exit code and no traceback."""
    pytester.makepyfile(raiser=RAISER)
    (pytester.mkdir("scenarios") / "raises.toml").write_text(SCENARIO)
    result = pytester.runpytest_subprocess("scenarios", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(ROOT_CAUSE_LINES)
