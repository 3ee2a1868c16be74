"""Faults as data, each trigger kind; each test checks the fault fired and the recovery."""

from __future__ import annotations

import re
import signal
import time

import psutil
import pytest

from harness import Cluster, WorkerState
from harness.errors import ConfigError
from harness.faults import After, AtStep, OnState, ScheduledFault, WorkerHang, WorkerKill
from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")


def test_exit_code_crash_at_exact_rank_and_step(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1) as cluster:
        job = cluster.launch(STEPPER, "8", "0.02")
        job.inject(WorkerKill(exit_code=3), AtStep(step=4, rank=1))
        result = job.wait(timeout=60)
        assert result.state == WorkerState.SUCCEEDED
        exits = [e for e in job.timeline.events("worker_exit") if e["exitcode"] == 3]
        assert [(e["rank"], e["restart_count"]) for e in exits] == [(1, 0)]
        steps = [e["step"] for e in job.timeline.steps(rank=1) if e["restart_count"] == 0]
        assert max(steps) == 4  # crashed at step 4, not before, not after
        assert job.timeline.restart_counts()[0] == 1


def test_signal_crash_on_state_trigger(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=2) as cluster:
        job = cluster.launch(STEPPER, "40", "0.02")
        job.inject(WorkerKill(local_rank=0, sig=int(signal.SIGTERM)), OnState(WorkerState.HEALTHY))
        job.wait_for_recovery(timeout=30)
        result = job.wait(timeout=60)
        assert result.state == WorkerState.SUCCEEDED
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_worker" and fault["sig"] == signal.SIGTERM
        assert any(e["exitcode"] == -signal.SIGTERM for e in job.timeline.events("worker_exit"))
        assert not job.pending_faults()


def test_hang_after_delay_stops_the_worker(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY)
        pid = job.worker_pids(0)[1]
        job.inject(WorkerHang(local_rank=1), After(0.2))
        deadline = __import__("time").monotonic() + 10
        while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
            assert __import__("time").monotonic() < deadline, "worker never stopped"
            __import__("time").sleep(0.02)
        [fault] = job.timeline.faults()
        assert fault["fault"] == "hang_worker" and fault.recovery_latency is None
        assert job.in_state(WorkerState.HEALTHY)  # stuck, not dead: the agent cannot tell


def test_exit_order_at_next_step(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=1) as cluster:
        job = cluster.launch(STEPPER, "30", "0.02")
        job.inject(WorkerKill(exit_code=9), OnState(WorkerState.HEALTHY))
        assert job.wait(timeout=60).state == WorkerState.SUCCEEDED
        assert [e["exitcode"] for e in job.timeline.events("worker_exit")][0] == 9


def test_a_fault_that_cannot_be_applied_fails_wait_and_is_not_fired(warm_pool):
    """No store process to lose in a one-node job: ``wait()`` raises with the reason (it
    used to return normally, the error kept in a list nothing read), and the fault is not
    listed as fired."""
    from harness.faults import FaultError, StoreHostKill

    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "50", "0.02")
        entry = ScheduledFault(StoreHostKill(), OnState(WorkerState.HEALTHY))
        job.schedule([entry])
        with pytest.raises(FaultError, match=r"has no separate store process to lose"):
            job.wait(timeout=60)
        assert job.timeline.faults() == [] and not job.pending_faults()
        assert job.unfired_faults() == [entry] and job.failed_faults()[0][0] is entry
        [error] = job.timeline.events("fault_error")
        assert "store_host" in error["error"]
        with pytest.raises(ConfigError) as info:  # no connection to lose: nodes here, not on hosts
            job.network.host_unreachable(0, 3)
        assert str(info.value) == ("fault='host_unreachable' needs the node on a host (Cluster(hosts=...)): "
                                   "a node on this machine has no connection to lose")


def test_after_previous_arms_a_fault_only_once_its_predecessor_fired(warm_pool):
    """B (at step 3) is chained to A (at step 10): unchained it would fire first, in the
    first attempt; chained it waits for A, then for step 3 of the restarted attempt."""
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=2) as cluster:
        job = cluster.launch(STEPPER, "30", "0.02")
        job.schedule([ScheduledFault(WorkerKill(local_rank=0), AtStep(step=10, rank=0)),
                      ScheduledFault(WorkerKill(local_rank=1), AtStep(step=3, rank=0), after_previous=True)])
        assert job.wait(timeout=90).state == WorkerState.SUCCEEDED
        first, second = job.timeline.faults()
        assert (first["local_rank"], second["local_rank"]) == (0, 1)
        restarted = min(e["mono"] for e in job.timeline.events("worker_start") if e["restart_count"] == 1)
        assert second["mono"] > restarted
        assert job.timeline.restart_counts()[0] == 2


# -- faults that cannot fire say so ---------------------------------------------------------


def test_a_fault_on_a_target_the_job_can_never_have_is_refused_at_inject(warm_pool):
    """A node, local rank or rank outside the job's shape can never be hit: inject() says so
    at once, naming the valid values (it used to accept it, and the fault never fired)."""
    from harness.errors import ConfigError
    from harness.faults import OnWorldSize

    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"), nodes=1)
        for fault, trigger, message in [
            (WorkerKill(node=7, local_rank=0), AtStep(step=1, rank=0),
             "node=7 names no node of this job: its nodes are 0..1 (nnodes=1:2)"),
            (WorkerKill(local_rank=2), None, "local_rank=2 names no worker of a node: local ranks are 0..1"),
            (WorkerHang(), AtStep(step=1, rank=4), "rank=4 names no rank of this job: ranks are 0..3"),
            (WorkerHang(), OnState(WorkerState.HEALTHY, node=2), "state_node=2 names no node"),
            (WorkerHang(), OnWorldSize(size=5), "on_world_size=5 can never form: WORLD_SIZE is 1..4"),
        ]:
            with pytest.raises(ConfigError, match=re.escape(message)):
                job.inject(fault, trigger)
        assert not job.pending_faults() and job.timeline.events("fault_armed") == []


def test_wait_fails_naming_each_fault_that_never_fired_and_why(warm_pool):
    """The job ends with faults still pending: wait() raises FaultNotFired with one reason
    per trigger kind (it used to return as if all was well); allow_unfired=True accepts it."""
    from harness.faults import FaultNotFired, OnWorldSize

    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "5", "0.01")
        job.schedule([ScheduledFault(WorkerKill(local_rank=0), AtStep(step=1000, rank=0)),
                      ScheduledFault(WorkerHang(local_rank=1), AtStep(step=2, rank=1), after_previous=True),
                      ScheduledFault(WorkerHang(), OnWorldSize(size=1)),
                      ScheduledFault(WorkerHang(), After(3600)),
                      ScheduledFault(WorkerKill(exit_code=3), AtStep(step=999, rank=1))])
        with pytest.raises(FaultNotFired) as info:
            job.wait(timeout=60)
        text = str(info.value)
        for reason in ("WorkerKill(node=0, local_rank=0, sig=9, exit_code=None) @ AtStep(step=1000, rank=0) "
                       "never fired: rank 0 reported steps up to 4 only, none >= 1000",
                       "never fired: it was never armed: the fault before it never fired",
                       "never fired: no rendezvous round of WORLD_SIZE 1 formed while it was armed (rounds: [2])",
                       "never fired: the job ended before 3600s had passed",
                       "@ AtStep(step=999, rank=1) never fired: rank 1 reported no step 999"):
            assert reason in text, text
        assert len(info.value.unfired) == 5 and "\n" not in text
        assert job.wait(timeout=5, allow_unfired=True).state == WorkerState.SUCCEEDED


def test_a_step_trigger_on_a_script_that_reports_no_steps_asks_about_report_step(warm_pool):
    from harness.faults import FaultNotFired

    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(str(SCRIPTS / "env_dump.py"))
        job.inject(WorkerKill(), AtStep(step=1, rank=0))
        with pytest.raises(FaultNotFired, match=re.escape(
                "AtStep(step=1, rank=0) never fired: rank 0 reported no step >= 1 — does the script "
                "call harness.report_step?")):
            job.wait(timeout=60)


def test_kill_node_raises_when_the_agent_is_never_reaped(warm_pool):
    """The node fork server (the agent's parent) is stopped: the SIGKILLed agent stays a
    zombie, never reaped. kill_node used to return after 10 s as if it had been (its
    docstring promises a reaped agent with its terminal entry); now it says so."""
    import os

    from harness.faults import FaultError
    from harness.sim.nodes.forks import ForkedNode

    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY, timeout=30)
        if not isinstance(job.nodes[1].popen, ForkedNode):
            pytest.skip("node 1 was not forked by the node fork server here")
        server = cluster.pool.node_server().process.pid
        job.ledger.reap_timeout = 1.0
        os.kill(server, signal.SIGSTOP)
        try:
            with pytest.raises(FaultError, match=r"node 1's agent \(pid \d+\) was SIGKILLed but never reaped "
                                                 r"within 1s"):
                job.kill_node(1)
            # the harness saw the agent die (its pidfd) well before its parent reaps it: the exit
            # must still be recorded when it does (it was dropped after one second's wait)
            time.sleep(1.5)
        finally:
            os.kill(server, signal.SIGCONT)
        job.ledger.reap_timeout = 30.0
        job.ledger.await_exit(1)  # once its parent reaps again, the exit is recorded as before
        assert job.timeline.states(1)[-1] == WorkerState.FAILED
