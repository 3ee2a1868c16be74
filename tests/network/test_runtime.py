"""The runtime across simulated hosts: agents in two node namespaces rendezvous over the
bridge and their workers, forked by one shared zygote outside both, run gloo between them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.procs import ZygoteServerProcess
from tests.conftest import SCRIPTS


def test_two_hosts_rendezvous_and_all_reduce_over_the_bridge(net, tmp_path):
    zygote = ZygoteServerProcess()
    agents: list[subprocess.Popen] = []
    try:
        zygote.wait_ready()
        env = {**os.environ, "HARNESS_ZYGOTE": zygote.path, "TMPDIR": str(tmp_path)}
        env.pop("TORCHELASTIC_ERROR_FILE", None)
        # gloo binds to what the hostname resolves to (this machine's address, unknown in a
        # node's namespace) unless told the interface
        env["GLOO_SOCKET_IFNAME"] = "eth0"
        # every namespace has all its ports free: fixed ones are fine. Node 0 hosts the
        # store explicitly: matching the endpoint to "this machine" goes by hostname, and
        # every namespace shares the one hostname
        for node in (0, 1):
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "harness.run", "--nnodes=2", "--nproc-per-node=1",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={net.address(0)}:29400",
                 "--rdzv-id=bridge", f"--local-addr={net.address(node)}", "--start-method=zygote",
                 f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
                 str(SCRIPTS / "allreduce.py")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                preexec_fn=net.enter(node)))
        outs = [agent.communicate(timeout=90) for agent in agents]
        for agent, (_, err) in zip(agents, outs, strict=True):
            assert agent.returncode == 0, err
        sums = sorted(line for out, _ in outs for line in out.splitlines() if line.startswith("SUM"))
        assert sums == ["SUM rank=0 world=2 value=3", "SUM rank=1 world=2 value=3"]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
        zygote.close()


def test_a_partition_left_in_place_is_reported_when_the_cluster_closes(needs_netns, warm_pool):
    from harness import Cluster, WorkerState
    from tests.conftest import SCRIPTS

    with pytest.warns(UserWarning, match="network faults still in place .*node 1: partition"):
        with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, network="netns") as cluster:
            job = cluster.launch(str(SCRIPTS / "sleeper.py"))
            job.wait_for_state(WorkerState.HEALTHY, timeout=60)
            job.partition(node=1, peers=[0])
