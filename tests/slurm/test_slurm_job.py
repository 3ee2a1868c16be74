"""Jobs whose nodes run in a Slurm allocation (``Cluster(slurm=...)``), on the real Slurm lab:
each node's agent a job step on a node of the allocation, the harness's store reached at the
controller's address, a fault carried out on the node, and nothing left once the cluster
closes (the allocation released, no step running)."""

from __future__ import annotations

import signal
from pathlib import Path

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
            "python": str(checkout_python(tmp_path / "node-python")), **fields}


def _jobs(lab: SlurmLab) -> list[str]:
    return lab.run("squeue", "--noheader", "--format=%i").stdout.split()


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
