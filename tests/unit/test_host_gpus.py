"""GPUs of nodes on hosts (``harness.sim.places.hosts.gpus``): each host's own devices, as
its spec lists them, split between the job's slots placed on it; NCCL only where every
worker on every host has one of its own. No host is reached: the split is the specs'."""

from __future__ import annotations

import pytest

from harness import ClusterConfig
from harness.errors import ConfigError
from harness.hosts import parse_host
from harness.sim.places.hosts.gpus import HostsGpuPlan


def _hosts(*gpus: int) -> tuple:
    return tuple(parse_host(f"ssh://ci@10.0.0.{5 + i}", gpus=n) for i, n in enumerate(gpus))


def test_each_hosts_devices_are_split_between_the_slots_placed_on_it():
    two = _hosts(8, 8)
    plan = HostsGpuPlan(two, None, 4, 4)  # round robin: slots 0 and 2 on host 0, 1 and 3 on host 1
    assert [plan.slot(i) for i in range(4)] == [("0", "1", "2", "3"), ("0", "1", "2", "3"),
                                               ("4", "5", "6", "7"), ("4", "5", "6", "7")]
    assert plan.backend == "nccl"
    assert HostsGpuPlan(two, None, 4, 8).backend == "gloo"  # 16 workers on a host's 8 devices
    assert HostsGpuPlan(two, (0, 0), 2, 4).slot(1) == ("4", "5", "6", "7")  # both on host 0
    assert HostsGpuPlan(two, (0, 0), 2, 4).backend == "nccl"  # host 1 carries no slot
    alone = HostsGpuPlan(two, None, 2, 2)
    assert alone.slot(0) == ("0", "1") and alone.slot(1) == ("0", "1")
    bare = HostsGpuPlan(_hosts(8, 0), None, 2, 1)  # a host that lists none: its node gets none, gloo
    assert bare.slot(1) == () and bare.backend == "gloo"
    with pytest.raises(IndexError):
        plan.slot(4)


def test_a_node_past_max_nodes_takes_a_free_slot_of_its_own_host():
    two = _hosts(2, 2)
    plan = HostsGpuPlan(two, None, 4, 1)  # host 0: slots 0, 2 (devices 0, 1)
    assert plan.for_node(2, two[0], held={0, 1, 3}) == (2, ("1",))
    assert plan.for_node(4, two[0], held={2, 1, 3}) == (0, ("0",))  # slot 0's node is gone
    assert plan.for_node(4, two[0], held={0, 1, 2, 3}) == (4, ())  # none free: no devices


def test_gpus_in_a_hosts_spec_and_on_the_cluster():
    assert parse_host("ssh://ci@a", gpus=2).gpus == ("0", "1")
    assert parse_host("ssh://ci@a", gpus=["3", 5]).gpus == ("3", "5")
    assert parse_host("ssh://ci@a").gpus == ()
    for bad in (True, -1, "8", ["0,1"], [""]):
        with pytest.raises(ConfigError, match=r"must be a GPU count in \[0, 1024\] or a list of device ids"):
            parse_host("ssh://ci@a", gpus=bad)
    with pytest.raises(ConfigError, match=r"^gpus=2 is this machine's: with hosts, each host's own are split"):
        ClusterConfig(nnodes=2, hosts=["ssh://ci@a"], gpus=2)
