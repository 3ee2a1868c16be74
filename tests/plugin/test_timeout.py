"""pytest-timeout and elastic tests: the timeout each gets, and what a timed-out one leaves
(the stacks of its hung workers, and no processes)."""

from __future__ import annotations

import glob
import os
import re
import tempfile
import time

import psutil

from tests.conftest import SCRIPTS
from tests.plugin.sessions import runpytest_side_by_side

STEPPER = str(SCRIPTS / "stepper.py")

SHOW_TIMEOUTS = """
def pytest_collection_finish(session):
    for item in session.items:
        marker = item.get_closest_marker("timeout")
        print("TIMEOUT", item.name, marker.args[0] if marker else None)
"""

TESTS = """
import pytest

@pytest.mark.elastic(timeout=7)
def test_marker():
    pass

@pytest.mark.elastic
def test_default():
    pass

@pytest.mark.timeout(3)
@pytest.mark.elastic(timeout=7)
def test_explicit():
    pass

def test_plain():
    pass
"""


def _timeouts(result) -> dict[str, str]:
    return dict(line.split()[1:3] for line in result.stdout.lines if line.startswith("TIMEOUT "))


def test_elastic_tests_get_a_timeout(pytester):
    pytester.makeconftest(SHOW_TIMEOUTS)
    pytester.makepyfile(TESTS)
    scen = pytester.mkdir("scenarios")
    (scen / "s.toml").write_text(f"[job]\nscript = {STEPPER!r}\ntimeout = 10\n")
    (scen / "t.toml").write_text(f"[job]\nscript = {STEPPER!r}\n")
    # a scenario: its job's timeout (else the elastic default) + 30 s: the job's own error first
    expected = {"test_marker": "7.0", "test_default": "120.0", "test_explicit": "3", "test_plain": "None",
                "s": "40.0", "t": "150.0"}
    default, global_, elastic, without = runpytest_side_by_side(
        pytester, ["--co"], ["--co", "--timeout=50"], ["--co", "--timeout=50", "--elastic-timeout=9"],
        ["--co", "-p", "no:timeout"])
    assert _timeouts(default) == expected
    # a global pytest-timeout timeout stands for tests that name no elastic timeout ...
    assert _timeouts(global_) == {**expected, "test_default": "None", "t": "None"}
    # ... unless --elastic-timeout (or its env/ini) says otherwise
    assert _timeouts(elastic) == {**expected, "test_default": "9.0", "t": "39.0"}
    # without pytest-timeout nothing is added (and nothing breaks)
    assert _timeouts(without) == {**{name: "None" for name in expected}, "test_explicit": "3"}


HANGS = f"""
import pytest
from harness.faults import AtStep, WorkerHang

def hang_rank1(cluster):
    job = cluster.launch({STEPPER!r}, "100000", "0.05")
    job.inject(WorkerHang(local_rank=1), AtStep(step=3, rank=1))
    job.wait(timeout=600)

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, timeout=8)
def test_signal(elastic_cluster):
    hang_rank1(elastic_cluster)

@pytest.mark.timeout(8, method="thread")
@pytest.mark.elastic(nnodes=1, nproc_per_node=2)
def test_thread(elastic_cluster):
    hang_rank1(elastic_cluster)
"""


def test_timed_out_test_shows_worker_stacks_and_leaves_no_process(pytester):
    pytester.makepyfile(HANGS)
    dumps_before = _stack_dirs()
    # side by side: each waits out its 8 s timeout. The thread method's session gets its own
    # stack dir (not this session's): pytest-timeout's os._exit skips every cleanup there
    signal_run, thread_run = runpytest_side_by_side(
        pytester, ["-k", "signal"], ["-k", "thread"], env=[{}, {"HARNESS_STACK_DUMP_DIR": None}])
    # the signal method: a report section, then the fixture's teardown kills everything
    signal_run.assert_outcomes(failed=1)
    signal_run.stdout.fnmatch_lines([
        "E * Failed: Timeout (>8.0s) from pytest-timeout.",
        "*- elastic timeout: stacks of the live workers -*",
        "--- job 0 (*) node * local_rank 0 rank 0 pid *",
        "*File *stepper.py*, line * in <module>",
        "--- job 0 (*) node * local_rank 1 rank 1 pid * [[]stopped: continued for the dump, then stopped again[]]",
        "*File *stepper.py*, line * in <module>",
    ])
    # the thread method: pytest-timeout ends the process, after we printed and closed
    assert thread_run.ret == 1
    assert _stack_dirs() == dumps_before  # removed even though os._exit skips every cleanup
    thread_run.stdout.fnmatch_lines([
        "*+ Timeout +*",
        "*+ elastic timeout: stacks of the live workers +*",
        "--- job 0 (*) node * local_rank 0 rank 0 pid *",
        "*File *stepper.py*, line * in <module>",
    ])
    text = signal_run.stdout.str() + thread_run.stdout.str()
    pids = {int(p) for p in re.findall(r"^--- job .* pid (\d+)", text, re.M)}
    assert len(pids) == 4
    assert not _still_running(pids), f"workers left running after the timeouts: {_still_running(pids)}"


def _still_running(pids: set[int], grace: float = 10.0) -> list[int]:
    """The pids still running (not gone, not zombies) after ``grace`` seconds: a SIGKILL is
    delivered asynchronously, and on a loaded machine the victim can take a moment to die."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + grace
    while True:
        running = [p.pid for p in procs if _running(p)]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stack_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "pytest-elastic-stacks-*")))


def test_env_names_agree():
    from harness.procs import _stackdump
    from pytest_elastic import _timeout

    assert _timeout.STACKS_ENV == _stackdump.STACKS_ENV
