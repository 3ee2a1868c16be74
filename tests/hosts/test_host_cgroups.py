"""Resource faults on hosts: a node on a host whose capabilities list ``cgroups``
gets its cgroup there, from a keeper under the connection's supervisor; ``slow_node`` and
``memory_limit`` are writes there, read back over SSH; the cgroup goes with the job.

The lab's hosts are namespaces of this machine: their kernel, cgroups and /proc are this
machine's, so what a host holds is read over its connection, as on a real host, and only
what cannot be read otherwise (a worker's status) is looked at from here. Skipped, with
what is missing, where this machine may make no cgroups.
"""

from __future__ import annotations

import pytest

from harness import Cluster, WorkerState
from harness.faults import AtStep, Heal, MemoryLimit, OnWorldSize, ScheduledFault
from harness.hosts import HostSpec
from harness.sim.places.hosts.cgroup_keeper import main as on_host
from harness.sim.places.hosts.cgroups import HostNodeCgroup
from harness.sim.resources import CgroupSupport, probe
from tests.conftest import SCRIPTS

SUPPORT = probe()
pytestmark = pytest.mark.skipif(not isinstance(SUPPORT, CgroupSupport), reason=f"needs {SUPPORT}")
BUSY = str(SCRIPTS / "busy.py")
HOG = str(SCRIPTS / "hog.py")


def _on_host(lab, spec: HostSpec, *argv: str) -> str:
    """``argv`` run on ``spec``'s host over a connection of its own; its stdout."""
    with lab.ssh_host(spec) as host:
        return host.run(list(argv)).stdout


def _existing(lab, spec: HostSpec, paths: list[str]) -> list[str]:
    """Which of ``paths`` exist on ``spec``'s host, asked over SSH."""
    out = _on_host(lab, spec, "sh", "-c", 'for p; do [ -e "$p" ] && echo "$p"; done; true', "sh", *paths)
    return out.split()


def test_a_memory_limit_on_a_host_is_its_oom_killer_and_the_cgroup_goes_with_the_job(lab, cgroup_hosts):
    """A 1-node job on a host: a limit 300 MB above what the node holds at step 1 is
    written to its cgroup there; the host's OOM killer takes the hog, the agent records it
    as such and restarts it; healed once the new round forms, the job succeeds. After
    close the cgroup is gone from the host."""
    with Cluster(nnodes=1, nproc_per_node=1, max_restarts=1, hosts=cgroup_hosts, start_method="spawn") as cluster:
        # a spawned worker imports torch itself: what the node holds at step 1 varies with
        # the load (0.8-1.1 GB seen), hence a relative limit; only the first attempt hogs
        job = cluster.launch(HOG, "150", "30")
        job.schedule([ScheduledFault(MemoryLimit(node=0, limit="+300M"), AtStep(step=1, rank=0)),
                      ScheduledFault(Heal(node=0), OnWorldSize(size=1), after_previous=True)])
        result = job.wait(timeout=120)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        reasons = [(e["restart_count"], e.get("reason")) for e in job.timeline.events("worker_exit")]
        assert reasons == [(0, "oom"), (1, None)]
        assert [e["healed"] for e in job.timeline.events("heal")] == [["memory_limit"]]
        [fault] = [f for f in job.timeline.faults() if f["fault"] == "memory_limit"]
        assert fault["bytes"] == fault["held"] + (300 << 20)  # held: read on the host
        cgroup = job.resources.cgroup(0)
        assert isinstance(cgroup, HostNodeCgroup) and cgroup.host.spec == cgroup_hosts[0]
        assert cgroup.oom_kills() == 1  # read on the host
        made = cgroup.distinct()
        assert _existing(lab, cgroup_hosts[0], made) == made
    assert _existing(lab, cgroup_hosts[0], made) == []


@pytest.mark.slow  # the default run writes a host's cgroup through the same apply (the memory limit above)
def test_a_slow_node_on_a_host_throttles_its_workers_there_until_healed(lab, cgroup_hosts):
    """A node on a host: its agent and its worker are in its cgroup there; the quota is
    written there (read back over SSH), the host's scheduler throttles the worker, and the
    heal lifts it. (Zygote workers: the agent's own zygote forks them on the host.)"""
    with Cluster(nnodes=1, nproc_per_node=1, max_restarts=0, hosts=cgroup_hosts, start_method="zygote") as cluster:
        job = cluster.launch(BUSY, "100000", "300000")  # a step: ~10 ms of CPU
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        slow = job.resources.cgroup(0)
        assert isinstance(slow, HostNodeCgroup) and slow.host.spec == cgroup_hosts[0]
        assert slow.joined(job.nodes[0].pid)  # the agent's own child cgroup holds it, there
        [start] = job.timeline.events("worker_start", 0)
        assert start["worker_pid"] in slow.pids()  # a pid of the host, read there
        quota = [f"{d}/cpu.cfs_quota_us" if slow.version == 1 else f"{d}/cpu.max"
                 for c, d in slow.workers_dirs.items() if c == ("cpu" if slow.version == 1 else "")]
        job.slow_node(0, cpu=0.2)
        assert _on_host(lab, cgroup_hosts[0], "cat", *quota).split()[0] == "20000"
        throttled = slow.throttled()
        before = len(job.timeline.steps(rank=start["rank"]))
        assert job.bus.wait_until(lambda: len(job.timeline.steps(rank=start["rank"])) >= before + 20, 60)
        assert slow.throttled() > throttled  # the host's scheduler stopped them
        job.heal(0)
        assert _on_host(lab, cgroup_hosts[0], "cat", *quota).split()[0] in ("-1", "max")
        assert [e["healed"] for e in job.timeline.events("heal")] == [["slow_node"]]
        made = slow.distinct()
    assert _existing(lab, cgroup_hosts[0], made) == []


def test_the_host_side_touches_only_cgroups_the_harness_made(capsys):
    """``on_host apply`` takes its paths from a command line: any other path is refused in
    one JSON line, nothing written."""
    assert on_host(["apply", "1", '{"memory": "/sys/fs/cgroup/memory"}', "set_memory", "1"]) == 2
    assert on_host(["apply", "1", '{"memory": "/sys/fs/cgroup/memory/elastic_1_x/../../x"}', "read"]) == 2
    assert on_host(["apply", "1", '["/sys/fs/cgroup/memory/elastic_1_x"]', "read"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all('"error"' in line and "errno" in line for line in lines)
    assert "is not a cgroup this harness made" in lines[0]
    assert on_host(["bogus"]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m harness.sim.places.hosts.cgroup_keeper keep")
