"""The plugin's warm pool: one per session (per xdist worker), shared by every elastic
test, closed when the session ends."""

from __future__ import annotations

import re

from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")

TESTS = f"""
import pytest

def _run(cluster):
    job = cluster.launch({STEPPER!r}, "2", "0.01")
    assert job.wait(timeout=60).state.value == "SUCCEEDED"
    print("POOL", cluster.pool.pid)

@pytest.mark.elastic(nnodes=1, nproc_per_node=1)
def test_one(elastic_cluster):
    _run(elastic_cluster)

@pytest.mark.elastic(nnodes=1, nproc_per_node=2)
def test_two(elastic_cluster):
    _run(elastic_cluster)
"""


#: runs after the plugin's own pytest_unconfigure, while the session's process still lives
#: (once it exits, PDEATHSIG would end the zygote anyway and prove nothing)
CONFTEST = """
import os, re, pytest

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    import psutil
    for pid in map(int, re.findall(r"POOL (\\d+)", open("pools.txt").read())):
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        print("AFTER", pid, "alive" if alive else "gone")
"""


def test_one_pool_serves_the_session_and_ends_with_it(pytester, monkeypatch):
    from harness.sim.nodes.pool import SHARED_ZYGOTE_ENV

    monkeypatch.delenv(SHARED_ZYGOTE_ENV, raising=False)  # the session's own zygote is what this test is about
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(TESTS.replace('print("POOL", cluster.pool.pid)',
                                      'open("pools.txt", "a").write(f"POOL {cluster.pool.pid}\\n")'))
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=2)
    pids = {int(p) for p in re.findall(r"POOL (\d+)", (pytester.path / "pools.txt").read_text())}
    assert len(pids) == 1  # both tests forked their workers from one zygote
    [pid] = pids
    result.stdout.fnmatch_lines([f"AFTER {pid} gone"])
