"""Resource faults for real: a node's cgroup, its CPU quota (a straggler), its memory limit
(the kernel's OOM killer, recorded as such), healing, and no cgroup left after a run or a
killed run. Skipped, with what is missing, where this process may make no cgroups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness import Cluster, WorkerState
from harness.errors import ConfigError
from harness.faults import AtStep, Heal, MemoryLimit, ScheduledFault, SlowNode
from harness.sim.resources import CgroupSupport, parse_bytes, probe
from harness.sim.resources.cgroups import PERIOD_US
from tests.conftest import SCRIPTS

SUPPORT = probe()
pytestmark = pytest.mark.skipif(not isinstance(SUPPORT, CgroupSupport), reason=f"needs {SUPPORT}")
BUSY = str(SCRIPTS / "busy.py")
HOG = str(SCRIPTS / "hog.py")
STEPPER = str(SCRIPTS / "stepper.py")


def cpu_periods(cgroup) -> tuple[float, int]:
    """(CPU seconds its workers used, CFS periods elapsed while they ran) of a node's cgroup
    (the quota is on its workers' cgroup; the agent is outside it)."""
    cpu = cgroup.workers_dirs.get("cpu", cgroup.workers_dirs.get(""))
    with open(os.path.join(cpu, "cpu.stat")) as fp:
        stat = dict(line.split() for line in fp if line.strip())
    acct = cgroup.workers_dirs.get("cpuacct", cpu)
    name = "cpuacct.usage" if "cpuacct" in cgroup.workers_dirs else None
    if name is None:
        used = int(stat["usage_usec"]) / 1e6
    else:
        with open(os.path.join(acct, name)) as fp:
            used = int(fp.read()) / 1e9
    return used, int(stat["nr_periods"])


@pytest.mark.skipif(not (os.geteuid() == 0 and os.path.exists("/sys/fs/cgroup/unified/cgroup.controllers")),
                    reason="needs root and a hybrid host's cgroup v2 mount at /sys/fs/cgroup/unified")
def test_a_v2_hierarchy_without_cpu_and_memory_says_what_is_missing():
    """cgroup v2 is detected by what is mounted at /sys/fs/cgroup: in a mount namespace of
    its own the probe sees this hybrid host's unified hierarchy there (the real kernel's,
    whose cpu and memory controllers v1 holds) and names what it lacks."""
    code = "from harness.sim.resources.cgroups import probe; print(probe())"
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             f"mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup && {sys.executable} -c '{code}'"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the cgroup v2 controller(s) cpu, memory (not available in /sys/fs/cgroup: "
                                    "its cgroup.controllers lists"), result.stdout


def test_every_process_of_a_node_is_in_its_cgroup(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(BUSY, "100000", "2000")
        job.wait_for_state(WorkerState.HEALTHY)
        for node in (0, 1):
            members = set(job.resources.cgroup(node).pids())
            # the agent joined first thing; the workers the zygote forked were moved in
            assert {job.nodes[node].pid, *job.worker_pids(node).values()} <= members
        assert not set(job.resources.cgroup(0).pids()) & set(job.resources.cgroup(1).pids())


def test_a_nodes_agent_runs_apart_from_and_before_its_workers(warm_pool):
    """The agent's CPU cgroup is not its workers' (a quota slows the training, never the
    keep-alive), and its workers run at a lower priority (the agent runs first when both
    want the CPU)."""
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(BUSY, "100000", "2000")
        job.wait_for_state(WorkerState.HEALTHY)
        cgroup = job.resources.cgroup(0)
        agent = job.nodes[0].pid
        workers = list(job.worker_pids(0).values())
        cpu = "cpu" if cgroup.version == 1 else ""
        in_dir = set(cgroup_pids(cgroup.agent_dirs[cpu]))
        assert agent in in_dir and not in_dir & set(workers)
        assert set(workers) <= set(cgroup_pids(cgroup.workers_dirs[cpu]))
        agent_nice = os.getpriority(os.PRIO_PROCESS, agent)
        for pid in workers:
            for tid in os.listdir(f"/proc/{pid}/task"):  # every thread, not only the leader
                assert os.getpriority(os.PRIO_PROCESS, int(tid)) == agent_nice + 10


def cgroup_pids(directory: str) -> list[int]:
    with open(os.path.join(directory, "cgroup.procs")) as fp:
        return [int(line) for line in fp if line.strip()]


def test_a_starved_node_is_not_taken_for_a_dead_one(warm_pool):
    """A reproduction: node 1 held to 5 % of a CPU for 4 s used to be declared dead
    by node 0 (its agent starved behind its own workers), the job re-forming [4, 2, 4] with
    node 1's old workers alive in the new round. A straggler is slow, not dead: the world
    keeps its size and no invariant breaks."""
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=2, max_restarts=3) as cluster:
        job = cluster.launch(str(SCRIPTS.parent.parent / "scenarios" / "scripts" / "train.py"),
                             "--steps", "40", "--step-time", "0.05")
        job.inject(SlowNode(node=1, cpu=0.05), AtStep(step=3, rank=0))
        job.wait_for_state(WorkerState.HEALTHY)
        assert job.bus.wait_until(lambda: bool(job.timeline.faults()), 60)
        time.sleep(4.0)  # the straggler lasts 4 s
        assert job.resources.cgroup(1).throttled() > 0  # its workers were held to the quota
        job.heal(1)
        result = job.wait(timeout=120)
        assert result.state == WorkerState.SUCCEEDED
        assert job.timeline.world_sizes() == [4], job.timeline.format()
        assert not job.timeline.events("membership_change")


def test_slow_node_holds_the_node_to_its_cpu_quota_until_healed(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(BUSY, "100000", "300000")  # a step: ~10 ms of CPU
        job.wait_for_state(WorkerState.HEALTHY)
        slow = job.resources.cgroup(1)
        rank = job.timeline.events("worker_start", 1)[-1]["rank"]  # node 1's worker
        job.slow_node(1, cpu=0.2)
        used0, periods0 = cpu_periods(slow)
        throttled0 = slow.throttled()
        # wait for work, not for time: the busy worker of the slow node reports steps
        before = len(job.timeline.steps(rank=rank))
        assert job.bus.wait_until(lambda: len(job.timeline.steps(rank=rank)) >= before + 20, 60)
        used1, periods1 = cpu_periods(slow)
        # the kernel's guarantee: at most the quota in each period the cgroup ran in
        quota_s = 0.2 * PERIOD_US / 1e6
        used, periods = used1 - used0, periods1 - periods0
        assert used <= (periods + 1) * quota_s * 1.05
        # and the quota did stop it, where it wanted more than its quota: on a loaded machine
        # (the suite beside two busy loops: bench/flake.py --suite) the scheduler gave this
        # niced worker less than a fifth of a CPU in every period, and there was nothing for
        # the quota to stop (never throttled, it used less than the quota in each period)
        assert slow.throttled() > throttled0 or used < periods * quota_s, (used, periods, slow.throttled())
        # (which rank the step rates call the straggler is judged in lockstep training, where
        # the others sleep in the collective: scenarios/resources/straggler.toml; these two
        # workers both burn CPU, and on a loaded machine the free one waits for it too)
        job.heal(1)
        [fault] = [f for f in job.timeline.faults() if f["fault"] == "slow_node"]
        assert fault["target_node"] == 1 and fault["cpu"] == 0.2
        [heal] = job.timeline.events("heal")
        assert heal["healed"] == ["slow_node"] and heal["target_node"] == 1
        assert not job.resources.open_faults()
        before = len(job.timeline.steps(rank=rank))
        assert job.bus.wait_until(lambda: len(job.timeline.steps(rank=rank)) >= before + 2, 60)
        throttled = slow.throttled()  # a period that began before the heal is counted by now
        before = len(job.timeline.steps(rank=rank))
        assert job.bus.wait_until(lambda: len(job.timeline.steps(rank=rank)) >= before + 20, 60)
        assert slow.throttled() == throttled  # healed: never throttled again


def test_a_worker_past_the_memory_limit_is_killed_by_the_oom_killer_and_recorded(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(HOG, "20", "400", "--always")
        job.inject(MemoryLimit(node=0, limit="200M"), AtStep(step=1, rank=0))
        result = job.wait(timeout=90)
        assert result.state == WorkerState.FAILED
        [oom] = [e for e in job.timeline.events("worker_exit") if e.get("reason") == "oom"]
        assert oom["rank"] == 0 and oom["exitcode"] == -signal.SIGKILL
        others = [e for e in job.timeline.events("worker_exit") if e is not oom]
        assert others and all("reason" not in e for e in others)  # stopped by the agent: no OOM
        failure = result.failures[0]
        assert failure.message.startswith("killed by the OOM killer"), failure.message
        assert "limit 209715200 bytes" in failure.message
        assert job.resources.cgroup(0).oom_kills() == 1
        job.heal()


def test_the_agent_restarts_a_worker_the_oom_killer_took(warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=1) as cluster:
        job = cluster.launch(HOG, "40", "30")  # only the first attempt hogs: OOM by step 4
        job.schedule([ScheduledFault(MemoryLimit(node=0, limit="150M"), AtStep(step=1, rank=0)),
                      ScheduledFault(Heal(node=0), AtStep(step=5, rank=0), after_previous=True)])
        result = job.wait(timeout=90)
        assert result.state == WorkerState.SUCCEEDED
        reasons = [(e["restart_count"], e.get("reason")) for e in job.timeline.events("worker_exit")]
        assert reasons == [(0, "oom"), (1, None)]
        assert [e["healed"] for e in job.timeline.events("heal")] == [["memory_limit"]]


def test_faults_as_data_and_bad_values():
    with pytest.raises(ConfigError, match="cpu"):
        SlowNode(node=0, cpu=0)
    with pytest.raises(ConfigError, match="limit"):
        MemoryLimit(node=0, limit="lots")
    assert parse_bytes("300M") == 300 << 20 and parse_bytes("1G") == 1 << 30 and parse_bytes(4096) == 4096
    with Cluster(nnodes=1, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(BUSY, "50", "100")
        with pytest.raises(ConfigError, match="limit"):
            job.memory_limit(0, "1K")
        with pytest.raises(ConfigError, match=r"limit='\+1K' must be at least \+1M"):
            job.memory_limit(0, "+1K")
        with pytest.raises(ConfigError, match=r"limit='\+x' must be a size like .* or \"\+300M\""):
            job.memory_limit(0, "+x")
        with pytest.raises(ConfigError, match="cpu"):
            job.slow_node(0, cpu=10_000)
        with pytest.raises(ConfigError, match="node=3"):
            job.slow_node(3)
        job.wait(timeout=60)


def test_a_limit_above_what_the_node_holds_is_that_much_above_it(warm_pool):
    """``"+200M"``: the node's limit is what its processes hold when the fault fires, plus
    200 MiB; the event says both (``held``, ``bytes``) and the kernel holds that limit."""
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(BUSY, "100000", "2000")
        job.wait_for_state(WorkerState.HEALTHY)
        cgroup = job.resources.cgroup(0)
        job.memory_limit(0, "+200M")
        [fault] = [f for f in job.timeline.faults() if f["fault"] == "memory_limit"]
        assert fault["limit"] == "+200M" and fault["held"] > 0
        assert fault["bytes"] == fault["held"] + (200 << 20)
        memory = cgroup.dirs.get("memory", cgroup.dirs.get(""))
        name = "memory.limit_in_bytes" if "memory" in cgroup.dirs else "memory.max"
        with open(os.path.join(memory, name)) as fp:
            kernel = int(fp.read())
        assert fault["bytes"] - 4096 < kernel <= fault["bytes"]  # v1 rounds down to a page
        job.heal()


def test_an_unhealed_resource_fault_is_reported_at_close(warm_pool):
    cluster = Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=0)
    try:
        job = cluster.launch(BUSY, "100000", "2000")
        job.wait_for_state(WorkerState.HEALTHY)
        job.slow_node(0, cpu=0.5)
        assert job.resources.open_faults() == {0: ["slow_node"]}
        dirs = job.resources.cgroup(0).distinct()
    finally:
        with pytest.warns(UserWarning, match="resource faults still in place.*node 0: slow_node"):
            cluster.close()
    assert dirs and not [d for d in dirs if os.path.exists(d)]  # removed on close


_KILLED_RUN = textwrap.dedent("""
    import os, sys
    from harness import Cluster, WorkerState
    cluster = Cluster(nnodes=1, nproc_per_node=1, max_restarts=0)
    job = cluster.launch(sys.argv[1], "100000", "2000")
    job.wait_for_state(WorkerState.HEALTHY)
    job.memory_limit(0, "500M")
    print(*job.resources.cgroup(0).distinct(), flush=True)
    sys.stdin.read()   # until the test kills us
""")


def test_a_killed_run_leaves_no_cgroup_behind():
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, BUSY], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        dirs = proc.stdout.readline().split()
        assert dirs and all(os.path.isdir(d) for d in dirs)
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    jobs = {os.path.dirname(d) for d in dirs}
    assert all(os.path.isdir(d) for d in jobs)  # nobody closed them: the owner was SIGKILLed
    with Cluster(nnodes=1, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(BUSY, "5", "100")  # its cgroup is made after sweeping dead owners'
        job.wait(timeout=60)
    assert not [d for d in jobs if os.path.exists(d)]


def test_a_chaos_straggler_ends_with_the_job_and_is_left_to_nobody(warm_pool):
    """Chaos slows node 0 and would heal it 10 minutes later; the job ends in a second. Its
    heal comes as the training is over (``at_end``), and closing the cluster warns of no
    resource fault left in place (warnings are errors here: one would fail this test)."""
    from harness.sim.faults.chaos import AfterHealthy, ChaosConfig

    schedule = (ScheduledFault(SlowNode(node=0, cpu=0.5), AfterHealthy(seconds=0.0)),
                ScheduledFault(Heal(node=0), AfterHealthy(seconds=600.0), after_previous=True))
    chaos = ChaosConfig(seed=1, schedules=(schedule,))
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, chaos=chaos) as cluster:
        job = cluster.launch(STEPPER, "20", "0.02")
        assert job.wait(timeout=60).state == WorkerState.SUCCEEDED
    [fault] = job.timeline.events("fault")
    [heal] = job.timeline.events("heal")
    assert (fault["fault"], fault["chaos"]) == ("slow_node", True)
    assert heal["at_end"] is True and heal["chaos"] is True and heal["healed"] == ["slow_node"]
    assert job.resources.open_faults() == {}
