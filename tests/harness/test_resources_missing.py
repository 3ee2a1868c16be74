"""Where no cgroup can be made, a resource fault is a ``ConfigError`` naming what is missing,
and a job without them runs as ever. Made real, not mocked: the job runs in a mount
namespace of its own where /sys/fs/cgroup is covered by an empty tmpfs, or where a cgroup
hierarchy is read-only (``unshare --mount``: root only, skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare (a mount namespace of its own)")

_JOB = f"""
from harness import Cluster, WorkerState
from harness.errors import ConfigError
with Cluster(nnodes=1, nproc_per_node=1, max_restarts=0, network="loopback") as cluster:
    job = cluster.launch({str(SCRIPTS / "busy.py")!r}, "20", "100")
    for fault in (lambda: job.slow_node(0), lambda: job.memory_limit(0, "300M")):
        try:
            fault()
        except ConfigError as e:
            print("ConfigError:", e)
    assert job.wait(60).state == WorkerState.SUCCEEDED
    print("SUCCEEDED")
"""


@pytest.mark.parametrize("hide, says", [
    ("mount -t tmpfs none /sys/fs/cgroup", "is not mounted here"),
    ("mount -o remount,bind,ro /sys/fs/cgroup/cpu", "write access to the cgroup /sys/fs/cgroup/cpu"),
])
def test_a_resource_fault_without_cgroups_names_what_is_missing(hide, says):
    if not os.path.isdir("/sys/fs/cgroup/cpu"):
        pytest.skip("the read-only case remounts the cgroup v1 cpu hierarchy, not mounted here")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          f'{hide} && exec "$0" -c "$1"', sys.executable, _JOB],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("ConfigError:")]
    assert len(lines) == 2 and all(says in line and "resource faults need" in line for line in lines), out.stdout
    assert out.stdout.rstrip().endswith("SUCCEEDED")
