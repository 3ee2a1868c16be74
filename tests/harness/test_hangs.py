"""A hang is named within seconds of it, not at the end of the job's timeout: once a node's
workers all succeeded, every other node must end within the exit barrier, and ``wait``
raises ``JobHung`` naming the node, what its workers last reported, and their stacks."""

from __future__ import annotations

import pytest

from harness import Cluster, WorkerState
from harness.faults import AtStep, WorkerHang
from harness.sim import waits
from harness.sim.truth.hangs import JobHung
from tests.conftest import SCRIPTS

HANG_AT_EXIT = str(SCRIPTS / "hang_at_exit.py")


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 s grace past the bound instead of 5 s, where the test's worker lingers forever:
    the verdict is the same, 4 s sooner (a job whose nodes all end keeps the real grace)."""
    monkeypatch.setattr(waits, "GRACE_S", 1.0)


def test_a_node_whose_worker_never_exits_after_its_peers_succeeded_is_named_with_its_stack(warm_pool, short_grace):
    barrier = 2.0
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0, exit_barrier_timeout=barrier) as cluster:
        job = cluster.launch(HANG_AT_EXIT, "10", "1")  # rank 1 lingers after its last step
        with pytest.raises(JobHung) as caught:  # the rule's, not the timeout's TimeoutError
            job.wait(timeout=120)
        job.terminate()
    message = str(caught.value)
    hung = next(e["node"] for e in job.timeline.events("worker_start") if e["rank"] == 1)
    assert message.startswith(f"job {job.run_id} hung: node {hung} ")
    assert f"the exit barrier gives a slower node {barrier:g}s" in message
    assert "Its workers finished training and did not exit" in message
    assert "rank 1 (local 0, pid " in message and "last step 9" in message
    assert "linger_after_training" in message  # its Python stack, not a guess


def test_a_job_whose_nodes_all_end_is_no_hang(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0, exit_barrier_timeout=2.0) as cluster:
        job = cluster.launch(HANG_AT_EXIT, "10", "-1")  # nobody lingers
        assert job.wait(timeout=120).state.value == "SUCCEEDED"


def test_a_worker_that_never_exits_after_a_worker_of_its_round_did_is_named_in_a_single_node_job(warm_pool,
                                                                                                short_grace):
    """No exit barrier, no other node: the training is over once a worker of the round
    exited 0, and the one still alive past the bound is named."""
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=0, exit_barrier_timeout=2.0) as cluster:
        job = cluster.launch(HANG_AT_EXIT, "10", "1")
        with pytest.raises(JobHung) as caught:
            job.wait(timeout=120)
        job.terminate()
    message = str(caught.value)
    assert message.startswith(f"job {job.run_id} hung: node 0 ")
    assert "after rank 0 (pid " in message and "succeeded (round 0" in message
    assert "linger_after_training" in message


TRAIN = str(SCRIPTS.parent.parent / "scenarios" / "scripts" / "train.py")


@pytest.fixture
def short_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 s floor instead of 20 s (60 s with the watchdog): the same rule, named sooner (the
    job's step time is a few ms here, so the floor is the bound)."""
    from harness.sim.truth import hangs

    monkeypatch.setattr(hangs, "STALL_FLOOR_S", 2.0)
    monkeypatch.setattr(hangs, "STALL_WATCHDOG_FLOOR_S", 2.0)


def test_a_job_stuck_on_a_hung_worker_nothing_reaps_is_named_stalled_with_its_weakness(warm_pool, short_stall):
    """No node succeeds, so no exit barrier can name it: rank 1 is stopped (hang_worker) and
    rank 0 waits in the all-reduce with it, and with no watchdog nothing would ever reap it.
    ``wait`` names the stall in one line that says what the job lacks, not at its timeout
    (the watchdog's case, a worker stopped outside every timer: tests/unit/test_stall.py)."""
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1) as cluster:
        job = cluster.launch(TRAIN, "--steps", "100000")
        job.wait_for_state(WorkerState.HEALTHY, timeout=60)
        job.inject(WorkerHang(node=0, local_rank=1), AtStep(step=5, rank=1))
        with pytest.raises(JobHung) as caught:
            job.wait(timeout=120)
        job.terminate()
    head = str(caught.value).splitlines()[0]
    assert head.startswith(f"job {job.run_id} stalled: no event from any node or worker for ")
    assert "reaped by nothing" in head and "TORCHELASTIC_ENABLE_FILE_TIMER=1" in head
    assert "stacks:" in str(caught.value) and "rank 1 (local 1, pid " in str(caught.value)
