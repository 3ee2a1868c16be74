"""A Network is real: namespaces on a bridge that reach each other, nothing in the root
namespace, nothing left after close, a dead owner's leftovers swept, a live owner's kept."""

from __future__ import annotations

import gc
import ipaddress
import os
import signal
import subprocess
import sys

import pytest

from harness.sim.net import NETNS_RANGE, Network
from harness.sim.net.names import NETNS_DIR, delete_namespaces
from tests.network.conftest import our_namespaces
from tests.network.helpers import ARRIVES, connect, listener, root_namespace_state, socket_in


def test_nodes_and_store_reach_each_other_over_the_bridge(net):
    addresses = [net.address(i) for i in range(3)] + [net.store_address]
    assert len(set(addresses)) == 4
    assert all(ipaddress.ip_address(a) in NETNS_RANGE for a in addresses)
    server = listener(net, 1)
    store = listener(net, None)
    try:
        client = socket_in(net.enter(0))
        client.settimeout(ARRIVES)
        client.connect(server.getsockname())
        server.settimeout(ARRIVES)
        conn, peer = server.accept()
        assert peer[0] == net.address(0)  # no NAT: the node's own address on the wire
        client.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.close()
        client.close()
        assert connect(net, 2, store.getsockname(), ARRIVES) == "ok"
        # nodes are not on this machine's network: node 0's address is not local here
        probe = socket_in(None)
        with pytest.raises(OSError):
            probe.bind((net.address(0), 0))
        probe.close()
    finally:
        server.close()
        store.close()


def test_the_root_namespace_gets_nothing_and_close_removes_everything(needs_netns):
    before = root_namespace_state()
    net = Network(2, "netns")
    try:
        names = {net.namespace(0), net.namespace(1), net.store_namespace, net.switch_namespace}
        assert names <= our_namespaces()
        net.partition(0)  # rules and qdiscs too: they must live in the node's namespace
        net.bandwidth(1, "1mbit")
        assert root_namespace_state() == before
    finally:
        net.close()
    net.close()  # idempotent
    assert not our_namespaces()
    assert root_namespace_state() == before


def test_a_network_dropped_without_close_is_removed_by_its_finalizer(needs_netns):
    net = Network(1, "netns")
    name = net.namespace(0)
    assert name in our_namespaces()
    del net
    gc.collect()
    assert name not in our_namespaces()


def test_add_node_plugs_a_new_host_into_the_switch(net):
    new = net.add_node()
    assert new == 3 and net.nnodes == 4
    server = listener(net, new)
    try:
        assert connect(net, 0, server.getsockname(), ARRIVES) == "ok"
    finally:
        server.close()


_OWNER = """\
import sys
from harness.sim.net import Network
net = Network(1, "netns")
print(" ".join([net.namespace(0), net.store_namespace, net.switch_namespace]), flush=True)
sys.stdin.read()  # until the test closes our stdin
net.close()
"""


def _start_owner() -> tuple[subprocess.Popen, list[str]]:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    line = owner.stdout.readline()  # type: ignore[union-attr]
    assert line, "the owner process failed to build its network"
    return owner, line.split()


def _present(names: list[str]) -> list[str]:
    return [n for n in names if os.path.exists(os.path.join(NETNS_DIR, n))]


def test_leftovers_of_a_dead_owner_are_swept_and_a_live_owners_are_not(needs_netns):
    dead, dead_names = _start_owner()
    live, live_names = _start_owner()
    try:
        os.kill(dead.pid, signal.SIGKILL)  # no close(): its namespaces stay behind
        dead.wait()
        assert _present(dead_names) == dead_names
        with Network(1, "netns"):
            assert _present(dead_names) == []
            assert _present(live_names) == live_names
        live.stdin.close()  # type: ignore[union-attr]
        assert live.wait(30) == 0
        assert _present(live_names) == []
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream and not stream.closed:
                    stream.close()
        delete_namespaces(_present(dead_names + live_names))


def test_every_address_inside_is_ours_or_loopback(net):
    """198.18.0.0/15 on eth0 and loopback on lo: no IPv6 link-local, nothing on the switch."""
    import json

    loopback = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
    hosts = [net.namespace(i) for i in range(3)] + [net.store_namespace]
    for name in [*hosts, net.switch_namespace]:
        out = subprocess.run(["ip", "-n", name, "-j", "addr"], capture_output=True, text=True, check=True)
        for link in json.loads(out.stdout):
            for info in link.get("addr_info", []):
                addr = ipaddress.ip_address(info["local"])
                allowed = loopback if link["ifname"] == "lo" else (NETNS_RANGE,)
                assert any(addr in r for r in allowed), (name, link["ifname"], str(addr))
        routes = subprocess.run(["ip", "-n", name, "-j", "route"], capture_output=True, text=True,
                                check=True)
        assert all(r["dst"] == str(NETNS_RANGE) for r in json.loads(routes.stdout)), (name, routes.stdout)


def test_every_host_knows_every_other_hosts_mac_from_the_start(net):
    """No ARP on the simulated network: every namespace has a permanent neighbour entry for
    every other host (a node added later too, both ways), so neither a loaded machine's late
    ARP replies nor a partition can leave a host unresolved."""
    node = net.add_node()
    hosts = {f"n{i}": net.address(i) for i in range(net.nnodes)} | {"store": net.store_address}
    for host in hosts:
        namespace = net.store_namespace if host == "store" else net.namespace(int(host[1:]))
        out = subprocess.run(["ip", "-n", namespace, "neigh", "show", "nud", "permanent"],
                             capture_output=True, text=True, check=True).stdout
        known = {line.split()[0] for line in out.splitlines() if line.strip()}
        assert known == set(hosts.values()) - {hosts[host]}, (host, out)
    assert net.address(node) in known
