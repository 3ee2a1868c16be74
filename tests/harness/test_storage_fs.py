"""The harness's filesystem: a crash of a node loses what it never fsynced, and nothing else.

Every test here writes through the job's FUSE mount from real workers, crashes a node and
reads the files back; each would fail without the filesystem (a plain directory keeps every
byte a killed process wrote: the page cache survives a SIGKILL). Skipped, saying what is
missing, where FUSE cannot be had.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from harness import Cluster, WarmPool
from harness.errors import ConfigError
from harness.faults import NodeKill, OnFile
from harness.sim.storage.mount import StorageMount, fuse_missing, harness_mounts, sweep
from harness.sim.storage.standby import StandbyServer
from pytest_elastic.report.model import build_model

MISSING = fuse_missing()
needs_fuse = pytest.mark.skipif(MISSING is not None, reason=f"needs FUSE: missing {MISSING}")
WRITER = str(Path(__file__).resolve().parents[1] / "scripts" / "storage_writer.py")


def _wait_ready(job, ranks, timeout=60.0):
    deadline = time.monotonic() + timeout
    paths = [os.path.join(job.shared_dir, f"ready_{r}") for r in ranks]
    while not all(os.path.exists(p) for p in paths):
        assert time.monotonic() < deadline, f"workers never wrote {paths}\n{job.timeline.format()}"
        time.sleep(0.02)


def _size(job, name):
    return os.path.getsize(os.path.join(job.shared_dir, name))


@needs_fuse
@pytest.mark.parametrize("network", ["loopback", "auto"])  # mounted in every network mode
def test_lose_unsynced_keeps_what_was_fsynced_and_only_the_crashed_nodes_writes(network, warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", check_invariants=False, network=network) as cluster:
        job = cluster.launch(WRITER)
        _wait_ready(job, (0, 1))
        job.kill_node(1, lose_unsynced=True)
        assert _size(job, "synced_1") == 100_000  # fsynced: never lost
        assert _size(job, "unsynced_1") == 0  # created (durable), content never fsynced: gone
        assert _size(job, "torn_1") == 65_536  # back to its fsynced length
        assert os.path.getsize(os.path.join(job.node_disk(1), "disk_1")) == 0
        assert _size(job, "unsynced_0") == 100_000  # node 0 did not crash
        assert os.path.getsize(os.path.join(job.node_disk(0), "disk_0")) == 10_000
        with open(os.path.join(job.shared_dir, "synced_1"), "rb") as fp:
            assert fp.read() == b"S" * 100_000
        lost = {os.path.basename(e["path"]) for e in job.storage.lost}
        assert lost == {"unsynced_1", "torn_1", "disk_1", "log_1"}
        [event] = job.timeline.events("storage_lost")
        assert event["target_node"] == 1
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_node" and fault["lose_unsynced"] is True
        [kill] = build_model(job.timeline.events()).faults  # the report says what it took
        assert "shared/unsynced_1: 97.7 KB never fsynced lost, 0 B left" in kill.data_lost
        job.kill_node(0)
    # this process's mounts only: another xdist worker's jobs may be mounted meanwhile
    assert [fs for _, fs in harness_mounts() if fs.startswith(f"harness-{os.getpid()}-")] == []


@needs_fuse
def test_a_plain_kill_loses_nothing(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", check_invariants=False) as cluster:
        job = cluster.launch(WRITER)
        _wait_ready(job, (0, 1))
        job.kill_node(1)
        assert _size(job, "unsynced_1") == 100_000
        assert _size(job, "torn_1") == 131_072


@needs_fuse
def test_torn_keeps_a_prefix_of_the_last_unsynced_write(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", check_invariants=False) as cluster:
        job = cluster.launch(WRITER)
        _wait_ready(job, (0, 1))
        job.kill_node(1, lose_unsynced=True, torn=True)
        with open(os.path.join(job.shared_dir, "torn_1"), "rb") as fp:
            data = fp.read()
        assert data == b"T" * 65_536 + b"t" * 32_768  # fsynced part + half the last write


@needs_fuse
def test_big_writes_arrive_whole_and_an_append_follows_a_rollback(warm_pool):
    """The server's fast path (write-only handles written direct, libfuse's own buffer copy)
    delivers a multi-request write byte for byte; an appending handle, opened before a crash
    rolled its file back, appends at the rolled-back end, not at the size the kernel saw."""
    with Cluster(pool=warm_pool, nnodes="1:2", check_invariants=False) as cluster:
        job = cluster.launch(WRITER)
        _wait_ready(job, (0, 1))
        for node in (0, 1):
            with open(os.path.join(job.shared_dir, f"big_{node}"), "rb") as fp:
                assert fp.read() == b"0123456789" + random.Random(node).randbytes(3 << 20)
        log = os.path.join(job.shared_dir, "log_1")
        assert os.path.getsize(log) == 1500
        with open(log, "ab", buffering=0) as fp:
            job.kill_node(1, lose_unsynced=True)
            fp.write(b"x" * 10)
        with open(log, "rb") as fp:
            assert fp.read() == b"A" * 1000 + b"x" * 10


def _open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


@needs_fuse
def test_a_pools_server_serves_job_after_job_and_forgets_each():
    """One filesystem server, kept by the pool, mounts for each job in turn: the second job
    gets neither the first one's fault (left in place) nor its open descriptors."""
    with WarmPool() as pool:
        pids, fds = [], []
        for first in (True, False):
            with contextlib.ExitStack() as stack:
                if first:  # the fault left in place is reported when its job ends
                    stack.enter_context(pytest.warns(UserWarning, match="storage faults still in place"))
                cluster = stack.enter_context(Cluster(nnodes=1, pool=pool, check_invariants=False))
                job = cluster.launch(WRITER)
                _wait_ready(job, (0,))  # it wrote every file: no ENOSPC from the first job's fault
                pids.append(job.storage.mount.server_pid)
                if first:
                    job.disk_full()
                job.kill_node(0)
            fds.append(_open_fds(pids[-1]))
        assert pids[0] == pids[1]
        assert fds[0] == fds[1]  # the unsynced files' undo descriptors were closed with each mount


@needs_fuse
def test_a_job_without_fuse_leaves_the_pools_server_standing_by(monkeypatch):
    """A job that runs on plain directories (``HARNESS_FUSE=0``) hands the pool's server
    back unused: the next job with FUSE still finds it started."""
    with WarmPool() as pool:
        pool.stand_by_storage()
        server = pool.storage_server()
        assert server is not None
        pool.return_storage_server(server)
        monkeypatch.setenv("HARNESS_FUSE", "0")
        with Cluster(nnodes=1, pool=pool, check_invariants=False) as cluster:
            job = cluster.launch(WRITER)
            _wait_ready(job, (0,))
            assert not job.storage.available
            job.kill_node(0)
        assert pool.storage_server() is server
        server.close()


@needs_fuse
def test_a_standby_that_died_is_replaced_and_a_killed_server_is_not_kept(tmp_path):
    dead = StandbyServer()
    dead.process.kill()
    dead.process.wait()
    kept = []
    mount = StorageMount(str(tmp_path / "a"), None, "t", standby=dead, give_back=kept.append)
    mount.wait_mounted()
    assert mount.available and mount.server_pid != dead.process.pid
    os.kill(mount.server_pid, signal.SIGKILL)  # dies mounted: its dead mount is detached, it is not kept
    mount.close()
    assert kept == []
    assert not any(p == mount.mountpoint for p, _ in harness_mounts())


@needs_fuse
def test_on_file_holds_the_rename_until_the_node_is_dead(warm_pool):
    """The kill lands inside the write-then-rename: the tmp file is there (empty: never
    fsynced), the final name never appears."""
    with Cluster(pool=warm_pool, nnodes="1:2", check_invariants=False) as cluster:
        job = cluster.launch(WRITER, "--rename")
        job.inject(NodeKill(node=1, lose_unsynced=True), OnFile("ckpt_?", node=1))
        _wait_ready(job, (0,))
        deadline = time.monotonic() + 30
        while not job.timeline.events("storage_lost"):
            assert time.monotonic() < deadline, job.timeline.format()
            time.sleep(0.02)
        assert not os.path.exists(os.path.join(job.shared_dir, "ckpt_1")), job.timeline.format()
        assert _size(job, "ckpt_1.tmp") == 0
        assert os.path.exists(os.path.join(job.shared_dir, "ckpt_0"))  # node 0 was not watched
        assert not os.path.exists(os.path.join(job.shared_dir, "ready_1"))
        [seen] = job.timeline.events("file_event")
        assert seen["writer"] == 1 and seen["op"] == "rename" and seen["to"].endswith("/ckpt_1")
        assert _size(job, "ckpt_0") == 1000


@needs_fuse
def test_disk_full_fails_writes_with_enospc_until_healed(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, check_invariants=False) as cluster:
        job = cluster.launch(WRITER)
        _wait_ready(job, (0,))
        path = os.path.join(job.shared_dir, "big")
        job.disk_full()
        with pytest.raises(OSError) as caught, open(path, "wb") as fp:
            fp.write(b"x" * 10)
            fp.flush()
        assert caught.value.errno == errno.ENOSPC
        node_file = os.path.join(job.node_disk(0), "still_fine")
        with open(node_file, "wb") as fp:  # only the shared filesystem is full
            fp.write(b"ok")
        assert job.storage.open_faults() == {"shared": ["disk_full"]}
        job.heal()
        with open(path, "wb") as fp:
            fp.write(b"x" * 10)
        assert os.path.getsize(path) == 10
        [fault] = job.timeline.faults()
        assert fault["fault"] == "disk_full" and fault["device"] == "shared"
        [heal] = job.timeline.events("heal")
        assert heal["storage"] == {"shared": ["disk_full"]}
        assert job.storage.open_faults() == {}


@needs_fuse
def test_io_error_hits_only_matching_files_and_slow_io_delays_writes(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, check_invariants=False) as cluster:
        job = cluster.launch(WRITER)
        _wait_ready(job, (0,))
        job.io_error(node=0, errno=errno.EROFS, path="*.distcp")
        with pytest.raises(OSError) as caught:
            open(os.path.join(job.node_disk(0), "shard.distcp"), "wb").close()
        assert caught.value.errno == errno.EROFS
        open(os.path.join(job.node_disk(0), "other.bin"), "wb").close()
        job.heal(0)
        job.slow_io(delay=0.3)
        start = time.monotonic()
        with open(os.path.join(job.shared_dir, "slow"), "wb") as fp:
            fp.write(b"x")
            fp.flush()
            os.fsync(fp.fileno())
        assert time.monotonic() - start >= 0.6  # a lower bound: one write and one fsync
        with pytest.warns(UserWarning, match="storage faults still in place.*shared: slow_io"):
            cluster.close()
        assert any(e["kind"] == "storage_unhealed" for e in job.timeline.events())


@needs_fuse
def test_unhealed_faults_under_w_error_are_raised_after_everything_is_closed(warm_pool):
    """Under ``-W error`` the unhealed-fault warnings are raised, and only once everything
    of the job is closed: its filesystem unmounted, its store and its node gone, the
    cluster's dir removed (given first, the storage warning left the store server and the
    dirs behind, and a network or resource one every node)."""
    cluster = Cluster(pool=warm_pool, nnodes=1, check_invariants=False)
    job = cluster.launch(WRITER)
    _wait_ready(job, (0,))
    job.disk_full()
    mountpoint = job.storage.mount.mountpoint
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="storage faults still in place.*shared: disk_full"):
            cluster.close()
    with open("/proc/mounts") as mounts:
        assert job.storage.mount.closed and mountpoint not in mounts.read()
    assert not os.path.exists(cluster.directory) and not job.nodes[0].alive()


def test_without_fuse_storage_faults_say_what_is_missing(monkeypatch):
    monkeypatch.setenv("HARNESS_FUSE", "0")
    with Cluster(nnodes=1, check_invariants=False) as cluster:
        job = cluster.launch(WRITER)
        assert not job.storage.available
        _wait_ready(job, (0,))
        with pytest.raises(ConfigError, match="HARNESS_FUSE=0"):
            job.disk_full()
        with pytest.raises(ConfigError, match="lose_unsynced.*HARNESS_FUSE=0"):
            job.kill_node(0, lose_unsynced=True)
        job.kill_node(0)


@needs_fuse
def test_nothing_stays_mounted_when_the_owner_is_killed(tmp_path):
    """A harness process SIGKILLed mid-job: its server unmounts on its way out (PDEATHSIG);
    one SIGKILLed with it leaves a dead mount that the next harness process sweeps."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from harness import Cluster, WarmPool
        c = Cluster(nnodes=1, check_invariants=False)
        job = c.launch({WRITER!r})
        print(job.storage.mount.mountpoint, job.storage.mount.server_pid, flush=True)
        time.sleep(120)
    """)
    for kill_server in (False, True):
        owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            point, server = owner.stdout.readline().split()
            assert (point, f"harness-{owner.pid}-") in [(p, f[:len(f"harness-{owner.pid}-")])
                                                        for p, f in harness_mounts()]
            if kill_server:
                os.kill(int(server), signal.SIGKILL)
        finally:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
            owner.stdout.close()
        deadline = time.monotonic() + 10
        while kill_server is False and any(p == point for p, _ in harness_mounts()):
            assert time.monotonic() < deadline, "the server never unmounted after its owner died"
            time.sleep(0.05)
        if kill_server:
            assert any(p == point for p, _ in harness_mounts())  # dead, still mounted
            assert point in sweep()
        assert not any(p == point for p, _ in harness_mounts())
        from harness.sim.leftovers import remove_dead_owners

        remove_dead_owners("elastic_cluster_", os.path.dirname(point.split("/job_")[0]))
