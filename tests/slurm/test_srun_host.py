"""``SrunHost``: a node of a Slurm allocation as a host, its channel job steps (``srun``)
instead of SSH, on the real Slurm lab: the lease, commands, files put there, the clock
sample, and nothing of ours left on the node once closed."""

from __future__ import annotations

import os
import re
import sys

import pytest

from harness.hosts import HostError, HostSpec, SrunHost
from tests.hosts.sshd import checkout_python
from tests.slurm.lab import SlurmLab


def _allocate(lab: SlurmLab, nodes: int) -> str:
    done = lab.run("salloc", "--no-shell", f"--nodes={nodes}", "--job-name=pe-test", timeout=30)
    found = re.search(r"Granted job allocation (\d+)", done.stderr + done.stdout)
    assert found, done.stderr
    return found.group(1)


@pytest.fixture
def node_host(slurm_lab: SlurmLab, tmp_path):
    job = _allocate(slurm_lab, 3)
    python = checkout_python(tmp_path / "node-python")
    spec = HostSpec(address=slurm_lab.net.address(1), user="root", python=str(python))
    host = SrunHost(spec, job_id=job, node="node1", srun_command=slurm_lab.command("srun"), env=slurm_lab.env)
    yield host
    host.close()


def test_a_node_of_an_allocation_runs_commands_and_keeps_a_work_dir(slurm_lab: SlurmLab, node_host: SrunHost):
    with node_host as host:
        assert host.info is not None and host.info.executable == sys.executable
        ran = host.run(["sh", "-c", "echo $SLURMD_NODENAME; ip -4 -o addr show dev eth0"])
        assert ran.stdout.startswith("node1\n") and f"inet {slurm_lab.net.address(1)}/" in ran.stdout
        path = host.put("secret/token", b"s3cret\n")
        assert path.startswith(host.work_dir + "/") and host.run(["cat", path]).stdout == "s3cret\n"
        assert host.run(["stat", "-c", "%a", path]).stdout.strip() == "600"
        sample = host.ping()
        assert sample.rtt >= 0
        work_dir = host.work_dir
        assert os.path.isdir(work_dir)  # the lab's nodes share this machine's files
        with pytest.raises(HostError, match="no port forward through Slurm"):
            host.forward_remote("/tmp/nowhere.sock")
    assert not os.path.exists(work_dir)
    assert [p for p in slurm_lab.step_processes() if p.name() != "slurmstepd"] == []


def test_a_command_that_fails_to_start_says_srun_s_error(slurm_lab: SlurmLab, tmp_path):
    job = _allocate(slurm_lab, 1)  # node0 only
    spec = HostSpec(address=slurm_lab.net.address(2), user="root", python=sys.executable)
    host = SrunHost(spec, job_id=job, node="node2", srun_command=slurm_lab.command("srun"), env=slurm_lab.env)
    with pytest.raises(HostError, match=r"node node2 of Slurm job \d+: connecting: srun: error:"):
        host.open()


CONTROLLER = """
import json, sys
from harness.hosts import HostSpec, SrunHost
spec = HostSpec(address=sys.argv[1], user="root", python=sys.argv[2])
host = SrunHost(spec, job_id=sys.argv[3], node="node1", srun_command=json.loads(sys.argv[4]),
                env=json.loads(sys.argv[5]), keep_missed=0).open()
proc = host.start(["sleep", "300"])
print(json.dumps({"work_dir": host.work_dir}), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow  # about 3 s: the default run is at its 5-minute budget
def test_a_killed_controller_leaves_nothing_on_the_node(slurm_lab: SlurmLab, tmp_path):
    """SIGKILL the process that opened the node: its srun clients' stdin ends, srun forwards
    the end to the lease and the command's supervisor, and they end what they started there
    and remove the work dir (the lease's lifeline, carried by the steps; ``keep_missed=0``:
    no events kept for a controller that might come back)."""
    import json
    import signal
    import subprocess
    import time

    job = _allocate(slurm_lab, 3)
    python = checkout_python(tmp_path / "node-python")
    controller = subprocess.Popen(
        [str(python), "-c", CONTROLLER, slurm_lab.net.address(1), str(python), job,
         json.dumps(slurm_lab.command("srun")), json.dumps(slurm_lab.env)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with controller:
        work_dir = json.loads(controller.stdout.readline())["work_dir"]
        assert os.path.isdir(work_dir)
        deadline = time.monotonic() + 30
        while not any(p.name() == "sleep" for p in slurm_lab.step_processes()) and time.monotonic() < deadline:
            time.sleep(0.05)  # its step starting on node1
        assert any(p.name() == "sleep" for p in slurm_lab.step_processes())
        controller.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (os.path.exists(work_dir) or any(p.name() == "sleep" for p in slurm_lab.step_processes())) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(work_dir)
    assert not any(p.name() == "sleep" for p in slurm_lab.step_processes())
