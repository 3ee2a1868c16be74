"""A namespace's own settings made over netlink (``harness.sim.net.netlink``): what ``ip``
shows afterwards, a list of neighbours longer than one write, and the kernel's refusal
said as an ``OSError`` naming the request."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from harness.sim.net.netlink import HostSetup, configure_hosts
from harness.sim.net.rules import WIRE


def _ip_json(namespace: str, *argv: str) -> list[dict]:
    out = subprocess.run(["ip", "-n", namespace, "-j", *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _fd(net, node: int) -> int:
    return os.open(net.namespace_path(node), os.O_RDONLY | os.O_CLOEXEC)


def test_a_host_is_up_with_its_address_only_and_knows_its_neighbours(net):
    namespace = net.namespace(1)
    links = {link["ifname"]: link for link in _ip_json(namespace, "addr")}
    assert "UP" in links["lo"]["flags"] and "UP" in links[WIRE]["flags"]
    assert [(a["family"], a["local"], a["prefixlen"]) for a in links[WIRE]["addr_info"]] == [
        ("inet", net.address(1), 15)]  # no IPv6 link-local: its address generation is off
    neighbours = {n["dst"]: n["lladdr"] for n in _ip_json(namespace, "neigh", "show", "nud", "permanent")}
    assert neighbours[net.address(0)] == "02:00:c6:12:01:01"


def test_more_neighbours_than_one_write_all_land(net):
    """2 000 entries in one namespace: many writes, each acknowledged before the next."""
    extra = [(f"198.19.{i // 250}.{i % 250 + 1}", bytes([2, 0, 198, 19, i // 250, i % 250 + 1])) for i in range(2000)]
    fd = _fd(net, 0)
    try:
        configure_hosts([HostSetup(fd, WIRE, neighbours=extra)])
    finally:
        os.close(fd)
    known = {n["dst"] for n in _ip_json(net.namespace(0), "neigh", "show", "nud", "permanent")}
    assert {address for address, _ in extra} <= known


def test_a_refused_request_is_an_oserror_that_names_it(net):
    fd = _fd(net, 2)
    try:
        with pytest.raises(OSError) as refused:  # its address is there already
            configure_hosts([HostSetup(fd, WIRE, net.address(2), 15)])
        assert refused.value.errno == errno.EEXIST
        assert f"addr add {net.address(2)}/15" in str(refused.value)
        # a later write refused too (a MAC one byte long): the first refusal is the one said
        neighbours = [(net.address(0), bytes([2, 0, 198, 18, 1, 1]))] * 70 + [("198.19.9.9", b"\x01")]
        with pytest.raises(OSError) as refused:
            configure_hosts([HostSetup(fd, WIRE, net.address(2), 15, neighbours)])
        assert refused.value.errno == errno.EEXIST, refused.value
        with pytest.raises(OSError, match="no interface"):
            configure_hosts([HostSetup(fd, "eth9")])
    finally:
        os.close(fd)
