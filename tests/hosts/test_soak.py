"""Soak and leak on hosts, as for local clusters.

Jobs one after another on the same two sshd hosts, each with a fault carried out there,
as a resilience suite runs its scenarios: after each, nothing of it is left on either host
(a process naming its work dir, the dir itself, an nft table, a cgroup), and after all of
them the controller holds no more file descriptors or threads than after the first (a
connection, relay, keeper or clock upkeep that outlived its job would add one per job).
"""

from __future__ import annotations

import glob
import os
import subprocess
import threading
from pathlib import Path

import pytest

from harness import Cluster
from harness.faults import AtStep, Heal, OnWorldSize, Partition, ScheduledFault, WorkerKill
from harness.states import WorkerState
from tests.hosts.observe import left_on
from tests.hosts.sshd import SshdLab

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scenarios" / "scripts" / "train.py"
JOBS = 6
#: what a job may still hold here once closed and collected, beyond the first job's: the
#: lazily made (process-wide) things the first job may not have made yet
_FDS_SLACK, _THREADS_SLACK = 2, 0


def _faults(round_: int) -> list[ScheduledFault]:
    """A worker killed on host 1, or node 2 (which shares host 0 with node 0) cut off and healed."""
    if round_ % 2 == 0:
        return [ScheduledFault(WorkerKill(node=1), AtStep(step=5, rank=0))]
    return [ScheduledFault(Partition(node=2, peers="all"), AtStep(step=5, rank=0)),
            ScheduledFault(Heal(node=2), OnWorldSize(2), after_previous=True)]


def _ours_left(lab: SshdLab, run_id: str) -> dict[str, list[str]]:
    """nft tables on the lab's hosts, and the job's cgroups there (the hosts share this
    machine's cgroup filesystems), left after a job."""
    tables = []
    for index in lab.hosts:
        out = subprocess.run(["ip", "netns", "exec", lab.net.namespace(index), "nft", "list", "tables"],
                             capture_output=True, text=True).stdout
        tables += [line for line in out.splitlines() if " pe_" in line]
    return {"tables": tables, "cgroups": glob.glob(f"/sys/fs/cgroup/**/elastic_*_{run_id}", recursive=True)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_jobs_in_a_row_on_hosts_leave_nothing_there_and_leak_nothing_here(lab, netns_cgroup_hosts, tmp_path):
    fds, threads = [], []
    for round_ in range(JOBS):
        checkpoints = tmp_path / f"ckpt{round_}"  # a fresh run each time, not a resumed one
        checkpoints.mkdir()
        with Cluster(nnodes="2:3", nproc_per_node=1, max_restarts=3, hosts=netns_cgroup_hosts,
                     start_method="zygote") as cluster:
            job = cluster.launch(str(TRAIN), "--steps", "30", "--step-time", "0.03", "--ckpt-dir",
                                 str(checkpoints))
            job.schedule(_faults(round_))
            result = job.wait(timeout=180)
            assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
            assert job.timeline.faults(), job.timeline.format()
            work_dirs = {spec.label: link.host.work_dir for spec, link in job.place._links.items()}
            run_id = job.run_id
        for spec in netns_cgroup_hosts:
            assert left_on(lab, spec, [work_dirs[spec.label]]) == {"procs": [], "dirs": []}, (round_, spec.label)
        assert _ours_left(lab, run_id) == {"tables": [], "cgroups": []}, round_
        fds.append(len(os.listdir("/proc/self/fd")))
        threads.append(threading.active_count())
    assert fds[-1] <= fds[0] + _FDS_SLACK, f"open fds after each job: {fds}"
    assert threads[-1] <= threads[0] + _THREADS_SLACK, f"threads after each job: {threads}"
