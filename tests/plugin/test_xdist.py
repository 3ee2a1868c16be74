"""Elastic tests under ``pytest -n 2``: several multi-node jobs at once share nothing (no
fixed port, run id, store endpoint or temp dir collides) and all pass."""

from __future__ import annotations

import collections

WHO = """
import os, sys
with open(sys.argv[1], "a") as fp:  # one write per line: O_APPEND keeps lines whole
    fp.write(" ".join([os.environ["TORCHELASTIC_RUN_ID"], os.environ["MASTER_ADDR"] + ":" +
                       os.environ["MASTER_PORT"], os.environ["RANK"], os.environ["TMPDIR"]]) + "\\n")
"""

TESTS = """
import os
import pytest
from harness import WorkerState

@pytest.mark.parametrize("n", range(4))
@pytest.mark.elastic(nnodes="2", nproc_per_node=2, max_restarts=0)
def test_job(elastic_cluster, n):
    job = elastic_cluster.launch(os.path.abspath("who.py"), os.path.abspath("seen.txt"))
    assert job.wait(timeout=120).state == WorkerState.SUCCEEDED
    with open("jobs.txt", "a") as fp:
        fp.write(f"{job.run_id} {elastic_cluster.directory} {os.environ.get('PYTEST_XDIST_WORKER')}\\n")
"""


def test_parallel_elastic_tests_share_nothing(pytester):
    pytester.makepyfile(who=WHO)
    pytester.makepyfile(test_jobs=TESTS)
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2")
    result.assert_outcomes(passed=4)
    jobs = [line.split() for line in (pytester.path / "jobs.txt").read_text().splitlines()]
    assert len(jobs) == 4 and {w for *_, w in jobs} == {"gw0", "gw1"}
    assert len({run_id for run_id, *_ in jobs}) == 4  # unique run ids
    assert len({directory for _, directory, _ in jobs}) == 4  # and cluster temp dirs
    seen = [line.split() for line in (pytester.path / "seen.txt").read_text().splitlines()]
    assert len(seen) == 16  # 4 jobs x 2 nodes x 2 workers
    by_job = collections.defaultdict(set)
    for run_id, master, _rank, _tmpdir in seen:
        by_job[run_id].add(master)
    assert set(by_job) == {run_id for run_id, *_ in jobs}
    masters = [m for ms in by_job.values() for m in ms]
    assert all(len(ms) == 1 for ms in by_job.values())  # one master per job ...
    assert len(set(masters)) == 4  # ... and no two jobs share one
    assert len({t for *_, t in seen}) == 8  # a temp dir per node
