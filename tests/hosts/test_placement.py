"""Placement (``place``) and capability refusals (``refusal``): unit tests, no host."""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.hosts import CAPABILITIES, parse_host, place, refusal
from harness.sim.schema import NEEDS

HOSTS = [parse_host("ssh://ci@10.0.0.5"), parse_host("ssh://ci@10.0.0.6:2222", capabilities=["cgroups"])]


def test_round_robin_by_default():
    assert place(5, HOSTS) == [HOSTS[0], HOSTS[1], HOSTS[0], HOSTS[1], HOSTS[0]]
    assert place(0, HOSTS) == []
    assert place(3, []) == [None, None, None]  # no hosts: every node on this machine


def test_a_placement_pins_each_node():
    assert place(3, HOSTS, [1, 1, 0]) == [HOSTS[1], HOSTS[1], HOSTS[0]]
    assert place(3, HOSTS, (None, 0, None)) == [None, HOSTS[0], None]
    assert place(2, [], [None, None]) == [None, None]


@pytest.mark.parametrize(("nodes", "hosts", "placement", "message"), [
    (2, HOSTS, [0], "placement=[0] must give one host index per node: 2 nodes, 1 given"),
    (2, HOSTS, [0, 2], "placement[1]=2 must be an int in [0, 1] or None (this machine)"),
    (2, HOSTS, [0, -1], "placement[1]=-1 must be an int in [0, 1] or None (this machine)"),
    (1, HOSTS, [True], "placement[0]=True must be an int in [0, 1] or None (this machine)"),
    (1, HOSTS, ["0"], "placement[0]='0' must be an int in [0, 1] or None (this machine)"),
    (1, [], [0], "placement[0]=0 must be None (this machine): no hosts are given"),
    (1, HOSTS, "0", "placement='0' must be a list of host indexes, one per node"),
    (-1, HOSTS, None, "nodes=-1 must be an int >= 0"),
])
def test_bad_input_is_one_line_naming_the_field(nodes, hosts, placement, message):
    with pytest.raises(ConfigError) as caught:
        place(nodes, hosts, placement, source="hosts.toml")
    assert str(caught.value) == f"{message} (from hosts.toml)"


def test_capabilities_are_the_fault_rows_words():
    assert CAPABILITIES == NEEDS


def test_a_fault_the_host_cannot_do_is_refused_in_one_line():
    assert refusal(HOSTS[1], ["cgroups"]) is None
    assert refusal(HOSTS[0], []) is None
    assert refusal(HOSTS[1], ["netns", "cgroups", "netns"]) == (
        "host ci@10.0.0.6:2222 cannot do it: it needs netns, which the host's capabilities (cgroups) do not list; "
        "add 'netns' to its capabilities (its hosts or Slurm file's) if the host has it, or place the node elsewhere")
    assert refusal(HOSTS[0], ["fuse", "netns"]) == (
        "host ci@10.0.0.5:22 cannot do it: it needs fuse, netns, which the host's capabilities (none) do not list; "
        "add 'fuse', 'netns' to its capabilities (its hosts or Slurm file's) if the host has them, or place the node "
        "elsewhere")
