"""Storage faults on hosts: a node on a host whose capabilities list ``fuse``
gets its disk served there by the harness's filesystem, whose control link comes over the
connection; ``disk_full``, ``io_error``, ``slow_io`` on that disk are carried out there and
healed; the mount goes with the job. The same server serves its node's view of the job's
shared filesystem, so its faults are carried out there too, where one dir is every node's.

The writes are a worker's on its host (``disk_probe.py``: a process of the node, as the
server knows from the node's events there); a host's mounts are read from its /proc over
SSH. Skipped, saying what is
missing, where FUSE cannot be had.
"""

from __future__ import annotations

import dataclasses
import errno

import pytest

from harness import Cluster, WorkerState
from harness.faults import FaultRefused, NodeKill
from harness.hosts import HostSpec
from harness.sim.storage.mount import fuse_missing
from tests.conftest import SCRIPTS

MISSING = fuse_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"needs FUSE: missing {MISSING}")
SLEEPER = str(SCRIPTS / "sleeper.py")
PROBE = str(SCRIPTS / "disk_probe.py")


def _mounts_there(lab, spec: HostSpec, under: str) -> list[str]:
    """The mount points below ``under`` on ``spec``'s host, read over a connection of its own."""
    with lab.ssh_host(spec) as host:
        table = host.run(["cat", "/proc/self/mountinfo"]).stdout
    return [line.split()[4] for line in table.splitlines() if line.split()[4].startswith(under)]


def _probed(job, node: int, after: float) -> dict[str, int]:
    """What node ``node``'s probe's writes failed with, at its second step after ``after``
    (a monotonic time): the first may have begun before."""
    def seen() -> list[dict]:
        return [e for e in job.timeline.events("step", node) if e["mono"] > after]
    assert job.bus.wait_until(lambda: len(seen()) >= 2, 30), job.timeline.format()
    step = seen()[1]
    return {"plain": step["plain"], "distcp": step["distcp"]}


def _now_on_timeline(job) -> float:
    return max(e["mono"] for e in job.timeline.events())


def test_a_nodes_disk_on_a_host_is_served_there_and_its_faults_are_carried_out_there(lab, fuse_hosts):
    """Each node's disk is a harness mount on its host, written by its worker there; a full
    disk on node 1 fails its writes with ENOSPC (node 0's, on the other host, is not full),
    an injected errno on node 0 hits only matching files, the heal ends both, and after
    close nothing is mounted there."""
    with Cluster(nnodes=2, nproc_per_node=1, hosts=fuse_hosts, start_method="spawn",
                 check_invariants=False) as cluster:
        job = cluster.launch(PROBE)
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        work = [job.place.connection(i)[0].work_dir for i in (0, 1)]
        assert all(job.node_disk(i).startswith(work[i]) for i in (0, 1)), [job.node_disk(i) for i in (0, 1)]
        assert [len(_mounts_there(lab, spec, w)) for spec, w in zip(fuse_hosts, work, strict=True)] == [1, 1]
        ok = {"plain": 0, "distcp": 0}
        assert _probed(job, 1, 0.0) == ok and _probed(job, 0, 0.0) == ok
        job.disk_full(node=1)
        job.io_error(node=0, errno=errno.EROFS, path="*.distcp")
        fired = _now_on_timeline(job)
        assert _probed(job, 1, fired) == {"plain": errno.ENOSPC, "distcp": errno.ENOSPC}
        assert _probed(job, 0, fired) == {"plain": 0, "distcp": errno.EROFS}  # only node 0's, only *.distcp
        assert job.storage.open_faults() == {"node1": ["disk_full"], "node0": ["io_error"]}
        job.heal()
        healed = _now_on_timeline(job)
        assert _probed(job, 1, healed) == ok and _probed(job, 0, healed) == ok
        [heal] = job.timeline.events("heal")
        assert heal["storage"] == {"node1": ["disk_full"], "node0": ["io_error"]}
        faults = [(f["fault"], f["device"]) for f in job.timeline.faults()]
        assert faults == [("disk_full", "node1"), ("io_error", "node0")]
    assert [_mounts_there(lab, spec, w) for spec, w in zip(fuse_hosts, work, strict=True)] == [[], []]


@pytest.mark.parametrize("add", [pytest.param(False, id="two"), pytest.param(True, id="add", marks=pytest.mark.slow)])
def test_the_shared_filesystem_on_hosts_is_each_nodes_view_served_by_its_server(lab, fuse_hosts, tmp_path, add):
    """On two fuse hosts naming one ``shared_dir``, each node's ``{shared}`` is its view of
    the job's dir there, in its disk's mount (one mount per host still), written by its
    worker: ``disk_full`` with no node fails both nodes' writes there with ENOSPC; (slow, a
    2:3 job, whose first round waits its last call for the third node:)
    a node added while it is in place (node 2, on host 0) gets it from its first steps
    (its server is told before its node starts); the heal ends it on every view."""
    nfs = tmp_path / "nfs"
    nfs.mkdir()
    shared = [dataclasses.replace(spec, shared_dir=str(nfs)) for spec in fuse_hosts]
    with Cluster(nnodes="2:3" if add else 2, nproc_per_node=1, hosts=shared, start_method="spawn",
                 check_invariants=False) as cluster:
        job = cluster.launch(PROBE, str(1 << 30), "{shared}", nodes=2)
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        work = [job.place.connection(i)[0].work_dir for i in (0, 1)]
        assert [len(_mounts_there(lab, spec, w)) for spec, w in zip(shared, work, strict=True)] == [1, 1]
        ok, full = {"plain": 0, "distcp": 0}, {"plain": errno.ENOSPC, "distcp": errno.ENOSPC}
        assert _probed(job, 0, 0.0) == ok and _probed(job, 1, 0.0) == ok
        job.disk_full()
        fired = _now_on_timeline(job)
        assert _probed(job, 0, fired) == full and _probed(job, 1, fired) == full
        nodes = (0, 1, 2) if add else (0, 1)
        if add:
            assert job.add_node() == 2
            assert job.bus.wait_until(lambda: job.timeline.events("step", 2), 60), job.timeline.format()
            assert _probed(job, 2, 0.0) == full
        [written] = nfs.glob("pe-shared-*/shared")  # one dir: every node's files; no byte since full
        assert {p.name: p.stat().st_size for p in written.iterdir()} == {
            f"{name}{rank}.{ext}": 0 for rank in nodes for name, ext in (("probe", "bin"), ("shard", "distcp"))}
        job.heal()
        healed = _now_on_timeline(job)
        assert all(_probed(job, node, healed) == ok for node in nodes)
        [heal] = job.timeline.events("heal")
        assert heal["storage"] == {"shared": ["disk_full"]}
    assert [_mounts_there(lab, spec, w) for spec, w in zip(shared, work, strict=True)] == [[], []]
    assert list(nfs.iterdir()) == []


def test_the_shared_filesystem_on_hosts_needs_one_dir_and_fuse_on_every_host():
    """Refused in one line: where the nodes may be on two hosts that share no dir, and
    where a host does not list fuse; carried out on one host, or on hosts sharing one."""
    from harness.faults import DiskFull, ScheduledFault
    from harness.faults import Immediately as Now
    from harness.hosts import parse_host
    from harness.sim.places.hosts.refusals import refuse_faults

    two = [parse_host("ssh://ci@10.0.0.5", capabilities=["fuse"]), parse_host("ssh://ci@10.0.0.6",
                                                                             capabilities=["fuse"])]
    for fault in (DiskFull(), NodeKill(node=0, lose_unsynced=True)):
        with pytest.raises(FaultRefused, match=r"refused: the job's nodes are on hosts, and the shared filesystem of "
                           r"a job whose nodes may be on hosts ci@10.0.0.5:22, ci@10.0.0.6:22 is each host's own dir: "
                           r"name one they share \(shared_dir in the hosts or Slurm file\)$"):
            refuse_faults([ScheduledFault(fault, Now())], two, None, 2)
        refuse_faults([ScheduledFault(fault, Now())], two, None, 1)
        refuse_faults([ScheduledFault(fault, Now())], [dataclasses.replace(h, shared_dir="/nfs") for h in two], None, 2)
    bare = [parse_host("ssh://ci@10.0.0.5"), parse_host("ssh://ci@10.0.0.6")]
    with pytest.raises(FaultRefused, match=r"and the shared filesystem is served to each node by its host: host "
                                           r"ci@10.0.0.5:22 cannot do it: it needs fuse"):
        refuse_faults([ScheduledFault(DiskFull(), Now())], bare, None, 1)
