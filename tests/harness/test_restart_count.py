"""One restart count per job: every worker of a round sees the same
``TORCHELASTIC_RESTART_COUNT``, ``max_restarts`` is one budget for the whole job, and a
node that comes back as a fresh agent cannot reset it (pytorch#147064; torch counts per
agent, pytorch#108158). Membership changes still use no restart."""

from __future__ import annotations

import re
import shutil
import time
from collections import defaultdict

import pytest

from harness import Cluster, WorkerState
from tests.conftest import SCRIPTS

PROBE = str(SCRIPTS / "count_probe.py")
S = WorkerState
ETCD = pytest.mark.skipif(shutil.which("etcd") is None,
                          reason="etcd is not installed (Debian: apt-get install etcd-server)")


def _counts_by_round(job, out: str) -> dict[int, set[int]]:
    """round -> the ``TORCHELASTIC_RESTART_COUNT`` values its workers printed."""
    rounds = {s["worker_pid"]: s["round"] for s in job.timeline.events("worker_start")}
    seen: dict[int, set[int]] = defaultdict(set)
    for pid, count in re.findall(r"COUNT rank=\d+ pid=(\d+) count=(\d+)", out):
        seen[rounds[int(pid)]].add(int(count))
    return dict(seen)


def _wait_until(predicate, timeout: float, what: str, job) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s\n{job.timeline.format()}")
        time.sleep(0.02)


@pytest.mark.parametrize("backend", ["c10d", pytest.param("etcd", marks=[ETCD, pytest.mark.slow])])
def test_every_worker_of_the_round_after_a_failure_sees_one_count(capfd, backend, warm_pool):
    """Node 0's worker fails; node 1 only re-forms (a membership change for it). Under
    torch node 1's workers would go on seeing 0 while node 0's see 1."""
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, max_restarts=3, rdzv_backend=backend) as cluster:
        job = cluster.launch(PROBE, "40", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.kill_worker(node=0, local_rank=1)
        result = job.wait(timeout=60)
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [4, 4]
        assert _counts_by_round(job, capfd.readouterr().out) == {0: {0}, 1: {1}}
        starts = job.timeline.events("worker_start")
        assert sorted((s["round"], s["restart_count"]) for s in starts) == [(0, 0)] * 4 + [(1, 1)] * 4
        assert [e["restart_count"] for e in job.timeline.events("rendezvous")] == [0, 0, 1, 1]


def test_failures_on_different_nodes_use_one_budget_for_the_job(warm_pool):
    """max_restarts=1: node 0's failure uses the job's one restart, so node 1's failure
    ends the job (under torch node 1 still had a budget of its own and restarted)."""
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=1) as cluster:
        job = cluster.launch(PROBE, "600", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.kill_worker(node=0, local_rank=0)
        job.wait_for_recovery(timeout=30)
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.kill_worker(node=1, local_rank=0)
        result = job.wait(timeout=60)
        assert result.state == S.FAILED, job.timeline.format()
        assert job.timeline.world_sizes() == [2, 2]
        assert job.timeline.restart_counts() == {0: 1, 1: 1}
        assert "the job has used all 1 restart(s)" in job.agent_log(1)


def test_a_node_back_as_a_fresh_agent_cannot_reset_the_count(warm_pool):
    """pytorch#147064: a node that exits and rejoins at once got a fresh budget (even
    with --max-restarts=0, restarts without end). Here the job's count lives in the
    rendezvous: the new agent's workers start at 1 and its first failure ends the job."""
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=1) as cluster:
        job = cluster.launch(PROBE, "600", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.kill_worker(node=1, local_rank=0)  # the job's one restart
        job.wait_for_recovery(timeout=30)
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.kill_agent(node=1)  # node 1 goes ...
        fresh = job.add_node()  # ... and comes back at once: a new agent process
        job.wait_for_state(S.HEALTHY, timeout=30, node=fresh)
        _wait_until(lambda: job.timeline.world_sizes()[-1] == 2, 30, "fresh node in", job)
        starts = [s for s in job.timeline.events("worker_start") if s["node"] == fresh]
        assert starts and {s["restart_count"] for s in starts} == {1}, job.timeline.format()
        job.kill_worker(node=fresh, local_rank=0)
        result = job.wait(timeout=60)
        assert result.state == S.FAILED, job.timeline.format()
        assert "the job has used all 1 restart(s)" in job.agent_log(fresh)


def test_a_failure_every_node_sees_in_one_round_is_counted_once(capfd, warm_pool):
    """Every worker of round 0 exits 3: both agents see their own workers fail in the
    same round (or one sees the round the other opened). One restart, not two: with
    max_restarts=1 the job goes on and succeeds."""
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, max_restarts=1) as cluster:
        job = cluster.launch(PROBE, "5", "0.01", "--fail-first")
        result = job.wait(timeout=60)
        assert result.state == S.SUCCEEDED, job.timeline.format()
        counts = _counts_by_round(job, capfd.readouterr().out)
        assert counts[0] == {0} and all(c == {1} for r, c in counts.items() if r > 0), counts
