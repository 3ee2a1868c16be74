"""Jobs whose nodes run in a Slurm allocation (``Cluster(slurm=...)``), on the real Slurm lab:
each node's agent a job step on a node of the allocation, the harness's store reached at the
controller's address, a fault carried out on the node, and nothing left once the cluster
closes (the allocation released, no step running)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from harness import Cluster, WorkerState
from harness.faults import AtStep, WorkerKill
from harness.sim.truth.timeline import HARNESS
from tests.hosts.sshd import checkout_python
from tests.slurm.lab import SlurmLab

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _slurm(lab: SlurmLab, tmp_path: Path, **fields: object) -> dict[str, object]:
    """The lab as a ``Cluster(slurm=...)``: its controller's side, config and clients, and
    the nodes' interpreter (this checkout's)."""
    return {"controller_address": lab.controller_address, "controller_netns": f"/run/netns/{lab.net.store_namespace}",
            "slurm_conf": str(lab.conf), "client_prefix": lab.command()[:2],
            "python": str(checkout_python(tmp_path / "node-python")), "work_dir": str(lab.work_dir), **fields}


def _jobs(lab: SlurmLab) -> list[str]:
    return lab.run("squeue", "--noheader", "--format=%i").stdout.split()


@pytest.mark.slow  # the default run is at its budget: CI's Slurm step runs worker_sigkill and the others there
def test_a_worker_killed_on_its_slurm_node_restarts_the_job(slurm_lab: SlurmLab, tmp_path):
    """Two nodes, each an agent step on its own node of our allocation: kill_worker at a
    step (SIGTERM, by the supervisor on the node), the job restarts once and succeeds; the
    nodes are named by Slurm in the timeline; the allocation is released at close."""
    with Cluster(nnodes=2, nproc_per_node=1, max_restarts=1, start_method="spawn",
                 slurm=_slurm(slurm_lab, tmp_path)) as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "30", "0.05")
        job.inject(WorkerKill(node=1, sig=int(signal.SIGTERM)), AtStep(step=4, rank=0))
        result = job.wait(timeout=150)
        assert result.state == WorkerState.SUCCEEDED, [job.agent_log(0), job.agent_log(1)]
        assert len(_jobs(slurm_lab)) == 1
        starts = {e["target_node"]: e for e in job.timeline.events("node_start", HARNESS)}
        hosts = {i: (e["host"], e["addr"]) for i, e in starts.items()}
        assert {name for name, _ in hosts.values()} <= {"node0", "node1", "node2"} and len(hosts) == 2
        assert all(addr == slurm_lab.net.address(int(name[-1])) for name, addr in hosts.values())
        for node in (0, 1):
            assert job.timeline.states(node)[-1] == WorkerState.SUCCEEDED
            assert f"DONE rank={node} attempt=1" in job.agent_log(node)
        [fault] = job.timeline.faults()
        assert (fault["fault"], fault["target_node"]) == ("kill_worker", 1)
        assert job.timeline.restart_counts() == {0: 1, 1: 1}
    assert _jobs(slurm_lab) == []
    assert [p for p in slurm_lab.step_processes() if p.name() != "slurmstepd"] == []


def test_a_node_killed_or_removed_on_slurm_is_its_step_signalled_by_slurm(slurm_lab: SlurmLab, tmp_path, caplog):
    """kill_node is Slurm's own: ``scancel --signal=KILL`` on the node's step (srun says the
    task was killed: its supervisor too), remove_node SIGTERM to the agent alone (it leaves;
    Slurm's TERM would reach its workers first); a node added in between is a step on the Slurm node
    the killed one left idle; the job goes on and succeeds. Each node's Slurm job is in its
    ``node_start``, its step in its ``slurm_step`` event."""
    from harness.faults import NodeAdd, NodeKill, NodeRemove, ScheduledFault

    with Cluster(nnodes="1:3", nproc_per_node=1, max_restarts=1, start_method="spawn",
                 slurm=_slurm(slurm_lab, tmp_path)) as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "100", "0.03")
        job.schedule([ScheduledFault(NodeKill(node=1), AtStep(step=5, rank=0)),
                      ScheduledFault(NodeAdd(), AtStep(step=10, rank=0), after_previous=True),
                      ScheduledFault(NodeRemove(node=2), AtStep(step=20, rank=0), after_previous=True)])
        result = job.wait(timeout=150)
        logs = {node: job.agent_log(node) for node in range(4)}
        assert result.state == WorkerState.SUCCEEDED, logs
        [allocation] = _jobs(slurm_lab)
        starts = {e["target_node"]: e for e in job.timeline.events("node_start", HARNESS)}
        assert {e.get("slurm_job") for e in starts.values()} == {allocation}
        steps = {node: job.timeline.events("slurm_step", node)[-1]["step"] for node in range(4)}
        assert len(set(steps.values())) == 4 and all(s.startswith(f"{allocation}.") for s in steps.values())
        assert starts[3]["host"] == starts[1]["host"] != starts[0]["host"]  # the idle one
        # Slurm SIGKILLs each process of the step in turn: srun says the task was killed, or, where
        # the supervisor saw the agent die first, that it exited 137; that Slurm did it, not the
        # supervisor's fallback, is the log's silence below
        assert "task 0: Killed" in logs[1] or "task 0: Exited with exit code 137" in logs[1], logs[1]
        assert "received SIGTERM" in logs[2] and "CANCELLED" not in logs[2], logs[2]
        assert [(f["fault"], f["target_node"]) for f in job.timeline.faults()] == [
            ("kill_node", 1), ("add_node", 3), ("remove_node", 2)]
    assert _jobs(slurm_lab) == []
    assert "by its supervisor" not in caplog.text  # Slurm killed it: no fallback


@pytest.mark.slow  # the default run is at its 5-minute budget; the kill and remove test above stays in it
def test_a_node_its_scheduler_marks_down_ends_its_step_and_the_job_goes_on(slurm_lab: SlurmLab, tmp_path):
    """down_node, the scheduler's own node failure: Slurm marks the node's Slurm node DOWN
    and ends the step there ("Node failure"); our allocation is ``--no-kill``, so the job
    goes on with the node left and succeeds, and the node is back in service after."""
    from harness.sim.faults import fault_class

    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=1, start_method="spawn",
                 slurm=_slurm(slurm_lab, tmp_path, capabilities=["slurm_admin"])) as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "60", "0.05")
        job.inject(fault_class("down_node")(node=1), AtStep(step=5, rank=0))
        result = job.wait(timeout=150)
        assert result.state == WorkerState.SUCCEEDED, [job.agent_log(0), job.agent_log(1)]
        [fault] = job.timeline.faults()
        down = next(e["host"] for e in job.timeline.events("node_start", HARNESS) if e["target_node"] == 1)
        assert (fault["fault"], fault["target_node"], fault["slurm_node"]) == ("down_node", 1, down)
        assert "Node failure" in job.agent_log(1) or "NODE FAILURE" in job.agent_log(1), job.agent_log(1)
        assert job.timeline.states(0)[-1] == WorkerState.SUCCEEDED
    assert _jobs(slurm_lab) == []
    assert slurm_lab.state_of(down, ("idle", "idle*")) in ("idle", "idle*"), slurm_lab.node_states()


@pytest.mark.slow  # run by CI's Slurm step: the default run is at its budget
def test_a_drained_node_keeps_its_step_and_no_added_node_lands_there(slurm_lab: SlurmLab, tmp_path):
    """drain_node: Slurm drains the node's Slurm node (sinfo says so), its step goes on
    stepping; once that node is killed, the node added lands beside node 0 on the
    allocation's other node, not on the drained one though it is idle (Slurm would let a
    step of the allocation land there: the harness does not); healed, the node is back in
    service."""
    from harness.faults import Heal, NodeAdd, NodeKill, ScheduledFault
    from harness.sim.faults import fault_class

    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=1, start_method="spawn",
                 slurm=_slurm(slurm_lab, tmp_path, capabilities=["slurm_admin"])) as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "120", "0.04")
        job.schedule([ScheduledFault(fault_class("drain_node")(node=1), AtStep(step=3, rank=0)),
                      ScheduledFault(NodeKill(node=1), AtStep(step=30, rank=0)),
                      ScheduledFault(NodeAdd(), AtStep(step=10, rank=0), after_previous=True),
                      ScheduledFault(Heal(node=1), AtStep(step=20, rank=0), after_previous=True)])
        deadline = time.monotonic() + 60
        while not job.timeline.faults() and time.monotonic() < deadline:
            time.sleep(0.02)  # the scheduler's thread fires it
        # node 1's own start, by its index: the two nodes start together, and their events
        # come in either order
        drained = next(e["host"] for e in job.timeline.events("node_start", HARNESS) if e["target_node"] == 1)
        assert slurm_lab.state_of(drained, ("drng", "drain")) in ("drng", "drain"), slurm_lab.node_states()
        drained_at = job.timeline.faults()[0]["mono"]
        result = job.wait(timeout=150)
        assert result.state == WorkerState.SUCCEEDED, [job.agent_log(n) for n in range(3)]
        steps_after = [e for e in job.timeline.events("step", 1) if e["mono"] > drained_at]
        assert len(steps_after) >= 5  # its step went on
        starts = {e["target_node"]: e["host"] for e in job.timeline.events("node_start", HARNESS)}
        assert starts[2] == starts[0] != drained, starts  # the allocation's two nodes: not the drained one
        assert [(f["fault"], f["target_node"]) for f in job.timeline.faults()] == [
            ("drain_node", 1), ("kill_node", 1), ("add_node", 2)]
        [heal] = job.timeline.events("heal", HARNESS)
        assert heal["healed"] == ["drain_node"]
    assert _jobs(slurm_lab) == []
    assert slurm_lab.state_of(drained, ("idle",)) == "idle", slurm_lab.node_states()


@pytest.mark.slow  # about a minute: Slurm's detection, then the node's lease
def test_a_node_whose_slurmd_is_killed_is_lost_once_slurm_sees_it(tmp_path):
    """kill_slurmd: the node's slurmd killed (the lab's ``slurmd-ctl``, as an operator's
    command); its step runs on unseen until Slurm misses the daemon (``SlurmdTimeout`` 4 s
    here) and marks the node DOWN, then the step's srun ends ("Node failure") and the job
    goes on without it. Healed, the daemon is started again and the node comes back; nothing
    of the job is left."""
    from harness.faults import Heal, OnWorldSize, ScheduledFault
    from harness.sim.faults import fault_class

    (tmp_path / "lab").mkdir()
    with SlurmLab(tmp_path / "lab", 2, slurmd_timeout=4) as lab:
        slurm = _slurm(lab, tmp_path, capabilities=["slurm_admin"], slurmd_kill=lab.slurmd_kill,
                       slurmd_start=lab.slurmd_start)
        with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=1, start_method="spawn", slurm=slurm) as cluster:
            job = cluster.launch(str(SCRIPTS / "stepper.py"), "1200", "0.05")
            job.schedule([ScheduledFault(fault_class("kill_slurmd")(node=1), AtStep(step=5, rank=0)),
                          ScheduledFault(Heal(node=1), OnWorldSize(size=1), after_previous=True)])
            result = job.wait(timeout=240)
            logs = [job.agent_log(0), job.agent_log(1)]
            assert result.state == WorkerState.SUCCEEDED, logs
            [fault] = job.timeline.faults()
            lost = next(e for e in job.timeline.events("node_exit", HARNESS) if e["target_node"] == 1)
            assert (fault["fault"], fault["slurm_node"], lost["cause"]) == ("kill_slurmd", "node1", "kill_slurmd")
            assert lost["mono"] - fault["mono"] >= 4  # not before Slurm's SlurmdTimeout
            assert "Node failure on node1" in logs[1], logs[1]
            assert job.timeline.states(0)[-1] == WorkerState.SUCCEEDED
            [heal] = job.timeline.events("heal", HARNESS)
            assert heal["healed"] == ["kill_slurmd"]
        assert _jobs(lab) == []
        # back once its restarted slurmd registers (ReturnToService=2)
        assert lab.state_of("node1", ("idle",), timeout=30) == "idle", lab.node_states()
        assert lab.node_states() == {"node0": "idle", "node1": "idle"}
        assert len(lab.daemon_pids()) == 3  # slurmctld, and both nodes' slurmd (node1's restarted)


@pytest.mark.slow
def test_a_soak_of_jobs_in_a_row_leaves_nothing(slurm_lab: SlurmLab, tmp_path):
    """Three clusters in a row, two jobs each (one with a node killed by Slurm): every job
    succeeds, and after each cluster no allocation, no step process and no work dir is left."""
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="pe-soak-", dir="/tmp"))  # short: a relay's socket path fits 107 bytes
    try:
        _soak(slurm_lab, tmp_path, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _soak(slurm_lab: SlurmLab, tmp_path: Path, work: Path) -> None:
    from harness.faults import NodeKill

    for _ in range(3):
        with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=1, start_method="spawn",
                     slurm=_slurm(slurm_lab, tmp_path, work_dir=str(work))) as cluster:
            for killed in (False, True):
                job = cluster.launch(str(SCRIPTS / "stepper.py"), "30", "0.02")
                if killed:
                    job.inject(NodeKill(node=1), AtStep(step=5, rank=0))
                assert job.wait(timeout=120).state == WorkerState.SUCCEEDED, [job.agent_log(0), job.agent_log(1)]
        assert _jobs(slurm_lab) == []
        assert [p for p in slurm_lab.step_processes() if p.name() != "slurmstepd"] == []
        assert list(work.iterdir()) == []
