"""A filesystem the hosts share (the hosts file's ``shared_dir``): a job's
``{shared}`` on two hosts is one dir there, so one node sees what another wrote (a
checkpoint); it goes with the job, and a dead controller's is swept by the next job of
this machine. The lab's hosts share this machine's /tmp, as real ones would an NFS mount."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

from harness import Cluster, WorkerState
from tests.conftest import SCRIPTS

PROBE = str(SCRIPTS / "shared_probe.py")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_two_hosts_naming_one_shared_dir_share_the_jobs_shared(lab, hosts, tmp_path):
    base = tmp_path / "nfs"
    base.mkdir()
    left = base / f"pe-shared-{socket.gethostname()}-{_dead_pid()}-deadbeef"  # a killed controller's
    left.mkdir()
    (left / "ckpt").write_text("old")
    shared = [dataclasses.replace(spec, shared_dir=str(base)) for spec in hosts]
    with Cluster(nnodes=2, nproc_per_node=1, hosts=shared, start_method="spawn", max_restarts=0) as cluster:
        job = cluster.launch(PROBE, "{shared}")
        result = job.wait(timeout=90)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()  # each saw the other's file
        [mine] = [p for p in base.iterdir()]  # the dead controller's swept, the job's own there
        assert mine.name.startswith(f"pe-shared-{socket.gethostname()}-{os.getpid()}-{job.run_id}")
        assert sorted(p.name for p in mine.iterdir()) == ["orders", "scratch", "shared"]
        assert sorted(p.name for p in (mine / "shared").iterdir()) == ["hello_0", "hello_1"]
    assert list(base.iterdir()) == []  # removed with the job


def test_hosts_that_name_no_shared_dir_or_two_keep_their_own():
    from harness.hosts import parse_host
    from harness.sim.places.hosts.shared import shared_base

    a, b = parse_host("ssh://ci@10.0.0.5", shared_dir="/nfs"), parse_host("ssh://ci@10.0.0.6", shared_dir="/nfs")
    assert shared_base([a, b]) == "/nfs"
    assert shared_base([a, parse_host("ssh://ci@10.0.0.6")]) is None
    assert shared_base([a, parse_host("ssh://ci@10.0.0.6", shared_dir="/other")]) is None
