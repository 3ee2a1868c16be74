"""Cluster/Job on single-node jobs: launch, faults, timeline, results, cleanup."""

from __future__ import annotations

import signal

import pytest

from harness import Cluster, WorkerState
from tests.conftest import SCRIPTS, survivors
from tests.runtime import workers


def test_callable_job_return_values_and_timeline(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1) as cluster:
        job = cluster.launch(workers.crash_first_attempt)
        result = job.wait(timeout=60)
        assert result.state == WorkerState.SUCCEEDED
        assert result.return_values == {0: "attempt 1", 1: "attempt 1"}
        assert job.timeline.states(0) == [
            WorkerState.INIT, WorkerState.HEALTHY, WorkerState.FAILED, WorkerState.STOPPED,
            WorkerState.HEALTHY, WorkerState.SUCCEEDED]
        assert job.timeline.world_sizes() == [2, 2]
        assert job.timeline.restart_counts() == {0: 1}


def test_kill_worker_fault_recovers_and_is_recorded(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=2) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY, timeout=30)
        before = job.worker_pids(0)
        job.kill_worker(node=0, local_rank=1)
        job.wait_for_recovery(timeout=30)
        job.wait_for_state(WorkerState.HEALTHY, timeout=30)
        # a fresh set of workers; the old ones are gone
        after = job.worker_pids(0)
        assert set(after.values()).isdisjoint(before.values())
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_worker" and fault.detection_latency is not None
        assert fault.recovery_latency is not None and fault.recovery_latency >= fault.detection_latency
        exits = job.timeline.events("worker_exit")
        assert any(e["local_rank"] == 1 and e["exitcode"] == -signal.SIGKILL for e in exits)
    assert not survivors(list(before.values()) + list(after.values()), timeout=0)


def test_restarts_exhausted_job_fails_with_root_cause(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(workers.fail_on_rank_one)
        result = job.wait(timeout=60)
        assert result.state == WorkerState.FAILED
        assert list(result.failures) == [1]
        assert "rank one is broken" in result.failures[1].summary()
        assert result.exit_codes == {0: 1}


def test_kill_agent_takes_its_workers(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY, timeout=30)
        pids = list(job.worker_pids(0).values())
        job.kill_agent(0)
        assert not survivors(pids, timeout=10)
        result = job.wait(timeout=10)
        assert result.state == WorkerState.FAILED and result.run_results == {}


def test_script_module_and_second_job_share_the_warm_zygote(tmp_path, monkeypatch):
    (tmp_path / "tiny_mod.py").write_text("import os\nprint('MOD', os.environ['RANK'])\n")
    monkeypatch.chdir(tmp_path)
    with Cluster(nnodes=1, nproc_per_node=2) as cluster:
        first = cluster.launch("tiny_mod", module=True).wait(timeout=60)
        second = cluster.launch(str(SCRIPTS / "allreduce.py")).wait(timeout=60)
        assert first.state == second.state == WorkerState.SUCCEEDED


def test_bad_launch_arguments():
    with Cluster(nnodes=1) as cluster:
        with pytest.raises(ValueError, match="does not exist"):
            cluster.launch("/no/such.py")
        with pytest.raises(ValueError, match="nodes=3 must be in 1..1"):
            cluster.launch(workers.rank_times, 1, nodes=3)


def _import_report_and_vanish(name):
    """A worker that imports ``name``, reports a step, and dies without Python's exit path
    (as a SIGKILLed worker would): only the step can have taught the zygote."""
    import importlib
    import os

    import harness

    importlib.import_module(name)
    harness.report_step(0)
    os._exit(0)


def _imported(name):
    import sys

    return name in sys.modules


def test_a_pools_zygote_learns_a_workers_imports_at_its_first_step_and_preloads_them_for_the_next_job():
    from harness import WarmPool

    name = "mailbox"  # standard library, imported by neither torch nor the runtime
    with WarmPool() as pool, Cluster(nnodes=1, nproc_per_node=1, max_restarts=0, pool=pool) as cluster:
        assert cluster.launch(_imported, name).wait(timeout=60).return_values == {0: False}
        cluster.launch(_import_report_and_vanish, name).wait(timeout=60)
        for _ in range(100):  # the zygote imports it once idle, between jobs
            if cluster.launch(_imported, name).wait(timeout=60).return_values == {0: True}:
                break
        else:
            pytest.fail(f"the pool's zygote never preloaded {name}")


def test_jobs_in_a_row_hold_one_jobs_resources_and_a_finished_job_still_answers(warm_pool):
    """A cluster that runs jobs one after another releases each finished job when it
    launches the next: its threads and descriptors go (they stayed until the close: a few
    dozen jobs in a row ran out of descriptors), its events leave memory and are read back
    from its file when asked, and its result, timeline and invariants answer as before."""
    import os
    import threading

    def held(run_id: str) -> list[str]:
        return [t.name for t in threading.enumerate() if run_id in t.name]

    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1) as cluster:
        first = cluster.launch(workers.crash_first_attempt)
        assert first.wait(timeout=60).state == WorkerState.SUCCEEDED
        states, steps, events = first.timeline.states(0), first.timeline.world_sizes(), len(first.timeline.events())
        assert held(first.run_id)  # its bus reader and fault scheduler, while nothing came after it
        counts = []
        for _ in range(3):
            job = cluster.launch(workers.crash_first_attempt)
            assert job.wait(timeout=60).state == WorkerState.SUCCEEDED
            counts.append((threading.active_count(), len(os.listdir("/proc/self/fd"))))
        assert held(first.run_id) == [] and first.released == []
        assert counts[-1] == counts[0], counts  # flat: one job's threads and descriptors, not one per job
        assert first.timeline._events == []  # forgotten until asked
        assert first.timeline.states(0) == states and first.timeline.world_sizes() == steps
        assert len(first.timeline.events()) == events
        assert first.result().return_values == {0: "attempt 1", 1: "attempt 1"}
        assert first.invariant_problems() == []
