"""The Slurm lab itself: a real ``slurmctld`` and ``slurmd``s come up idle, a job step runs
on the node it is sent to (in that node's namespace), reaches a listener on the controller's
side, and nothing of the lab is left once it is closed."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import psutil
import pytest

from harness.sim.net.names import NETNS_DIR
from tests.slurm.lab import SlurmLab, slurm_missing


def test_each_step_runs_on_its_node_in_that_nodes_network(slurm_lab: SlurmLab):
    for index in range(slurm_lab.nnodes):
        done = slurm_lab.run("srun", "--overlap", "-N1", "-n1", "-w", slurm_lab.node_name(index),
                             "sh", "-c", "ip -4 -o addr show dev eth0; echo job=$SLURM_JOB_ID node=$SLURMD_NODENAME")
        assert done.returncode == 0, done.stderr
        assert f"inet {slurm_lab.net.address(index)}/" in done.stdout
        assert f"node={slurm_lab.node_name(index)}" in done.stdout and "job=" in done.stdout


def test_a_step_reaches_a_listener_on_the_controllers_side(slurm_lab: SlurmLab):
    listener = slurm_lab.net.call_in_store(lambda: socket.create_server((slurm_lab.controller_address, 0)))
    port = listener.getsockname()[1]
    heard: list[bytes] = []

    def accept() -> None:
        listener.settimeout(30)
        conn, _ = listener.accept()
        with conn:
            heard.append(conn.recv(64))

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        script = (f"import socket; s = socket.create_connection(({slurm_lab.controller_address!r}, {port}), 10); "
                  "import os; s.sendall(os.environ['SLURMD_NODENAME'].encode())")
        done = slurm_lab.run("srun", "-N1", "-w", slurm_lab.node_name(2), "python3", "-c", script)
        assert done.returncode == 0, done.stderr
        thread.join(30)
        assert heard == [b"node2"]
    finally:
        listener.close()


def _slurm_cgroups() -> set[str]:
    found = set()
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory"):
        if os.path.isdir(base):
            found |= {os.path.join(base, name) for name in os.listdir(base) if name.startswith("slurm")}
    return found


def test_closing_the_lab_leaves_nothing(tmp_path):
    """Closed with a step still running: the step, every daemon, the namespaces, the spool
    dir go; no cgroup of Slurm's is made (proctrack/linuxproc, task/none)."""
    if why := slurm_missing():
        pytest.skip(f"a real Slurm cluster: {why}")
    cgroups = _slurm_cgroups()
    lab = SlurmLab(tmp_path, 2)
    prefix = lab.net.store_namespace.rsplit("store", 1)[0]
    sleeper = psutil.Popen(lab.command("srun", "-N1", "-w", "node1", "sleep", "300"), env=lab.env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not any(p.name() == "sleep" for p in lab.step_processes()) and time.monotonic() < deadline:
            time.sleep(0.05)  # the step's process, running on node1
        assert any(p.name() == "sleep" for p in lab.step_processes())
        daemons = lab.daemon_pids()
        assert len(daemons) == 3
    finally:
        lab.close()
    sleeper.wait(30)  # srun ends with its cancelled step
    assert not [pid for pid in daemons if psutil.pid_exists(pid)]
    assert lab.step_processes() == []
    assert not [name for name in os.listdir(NETNS_DIR) if name.startswith(prefix)]
    assert not lab.spool.exists()
    assert _slurm_cgroups() == cgroups
