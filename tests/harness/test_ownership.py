"""Explicit ownership: what a ``Cluster`` starts ends with it; a shared ``WarmPool`` ends
with whoever created it.

The user's own leak check is the test: after ``with Cluster(...)`` this process has no
child left and the cluster's temp dir is gone (``tests/conftest.py`` checks the same after
every test, which is why a cluster-lifetime zygote could never hide here).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import subprocess
import sys
import tempfile
import warnings

import psutil
import pytest

from harness import Cluster, WarmPool, WorkerState
from harness.errors import ConfigError
from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE}


def _finish(cluster: Cluster) -> None:
    job = cluster.launch(STEPPER, "3", "0.01")
    assert job.wait(timeout=60).state == WorkerState.SUCCEEDED


def test_leaving_the_with_block_leaves_no_process_and_no_dir():
    before = _children()
    with Cluster(nnodes=1, nproc_per_node=2) as cluster:
        _finish(cluster)
        zygote = cluster.pool.pid
        assert zygote is not None and zygote in _children()  # the cluster's own zygote ran
        directory = cluster.directory
    assert _children() - before == set()
    assert not psutil.pid_exists(zygote) or psutil.Process(zygote).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(directory)


def test_a_shared_pool_outlives_its_clusters_and_dies_with_its_owner():
    with WarmPool() as pool:
        with Cluster(nnodes=1, nproc_per_node=1, pool=pool) as first:
            _finish(first)
        zygote = pool.pid
        assert zygote is not None and psutil.pid_exists(zygote)  # still warm for the next
        with Cluster(nnodes=1, nproc_per_node=1, pool=pool) as second:
            _finish(second)
        assert pool.pid == zygote  # the same interpreter served both
    assert pool.pid is None and zygote not in _children()


def _parent_pid() -> int:
    """A worker entrypoint: who forked it."""
    return os.getppid()


def test_a_pool_that_joins_another_pools_zygote_neither_starts_nor_stops_it():
    """``WarmPool(zygote=...)`` (or ``$HARNESS_POOL_ZYGOTE``): its jobs' workers are forked
    by the owner's zygote; it starts none of its own, and closing it leaves the owner's."""
    with WarmPool() as owner:
        path = owner.address()
        zygote = owner.pid
        with WarmPool(zygote=path) as joined:
            with Cluster(nnodes=1, nproc_per_node=2, pool=joined) as cluster:
                result = cluster.launch(_parent_pid).wait(timeout=60)
            assert result.state == WorkerState.SUCCEEDED
            assert result.return_values == {0: zygote, 1: zygote} and joined.pid is None
        assert owner.pid == zygote and psutil.pid_exists(zygote)


def test_a_closed_or_foreign_pool_is_refused():
    pool = WarmPool()
    pool.close()
    with pytest.raises(ConfigError, match="pool=.* is closed"):
        Cluster(pool=pool)
    with pytest.raises(ConfigError, match="must be a harness.WarmPool"):
        Cluster(pool="warm")  # type: ignore[arg-type]


def test_the_fault_free_copy_shares_the_pool_and_keeps_every_setting_but_chaos_and_golden():
    """It re-typed 14 keywords and dropped two: the twin rendezvoused on a harness store
    where the run used node 0's, and detected GPUs where the run was given ids."""
    from harness.sim.faults.chaos import ChaosConfig

    chaos = ChaosConfig(seed=1, kinds=("kill_worker",))
    with Cluster(nnodes="1:2", nproc_per_node=1, store_host="node0", gpus=["3", "4"], env={"A": "1"},
                 seed=7, network="loopback", chaos=chaos) as cluster:
        with cluster.fault_free_copy() as twin:
            assert [twin.gpus_for(slot) for slot in (0, 1)] == [("3",), ("4",)]  # not detected (none here)
            assert twin.pool is cluster.pool
            assert twin.config == dataclasses.replace(cluster.config, chaos=None, golden=True)
            assert (twin.config.store_host, twin.config.gpus) == ("node0", ("3", "4"))
            assert twin.network == cluster.network == "loopback"
        assert not cluster.pool.closed


def test_an_abandoned_cluster_is_closed_by_the_garbage_collector_with_a_warning():
    before = _children()
    cluster = Cluster(nnodes=1, nproc_per_node=1)
    job = cluster.launch(STEPPER, "100000", "0.05")
    job.wait_for_state(WorkerState.HEALTHY, timeout=60)
    directory = cluster.directory
    assert _children() - before  # agent, worker and zygote are running
    del job
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del cluster
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "never closed" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert _children() - before == set()
    assert not os.path.exists(directory)


def test_a_run_killed_before_close_leaves_its_dir_to_the_next_cluster(tmp_path, monkeypatch):
    """SIGTERM runs no ``close()``: the dead run's dir stays until the next ``Cluster`` in
    any process removes it; a dir whose owner still runs is never touched."""
    code = ("from harness import Cluster; c = Cluster(nnodes=1, nproc_per_node=1); "
            "print(c.directory, flush=True); import time; time.sleep(60)")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(SCRIPTS.parents[1])}
    killed = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead_dir = killed.stdout.readline().strip()
        assert os.path.dirname(dead_dir) == str(tmp_path)
        killed.send_signal(signal.SIGTERM)
        assert killed.wait(10) == -signal.SIGTERM
        assert os.path.isdir(dead_dir)  # nothing ran on the way out
        live_dir = tmp_path / f"elastic_cluster_{live.pid}_x"
        live_dir.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with Cluster(nnodes=1, nproc_per_node=1) as cluster:
            assert os.path.basename(cluster.directory).startswith(f"elastic_cluster_{os.getpid()}_")
            assert not os.path.exists(dead_dir)
            assert live_dir.is_dir()
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait()
        killed.stdout.close()
