"""Mode resolution and input checks: one-line ConfigErrors, no namespaces needed."""

from __future__ import annotations

import os

import pytest

from harness.errors import ConfigError
from harness.sim.net import Network, netns_missing, resolve_mode
from harness.sim.net.rules import render


@pytest.fixture
def loop():
    net = Network(3, "loopback")
    yield net
    net.close()


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_modes_resolve_by_probing():
    assert resolve_mode("loopback") == "loopback"
    assert resolve_mode("auto") == ("loopback" if netns_missing() else "netns")
    with pytest.raises(ConfigError) as e:
        resolve_mode("vxlan")
    assert _one_line(e) == "network='vxlan' must be \"auto\", \"netns\" or \"loopback\""


def test_netns_where_impossible_names_what_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    netns_missing.cache_clear()
    try:
        with pytest.raises(ConfigError) as e:
            Network(1, "netns")
        text = _one_line(e)
        assert "'nft' binary (Debian package nftables)" in text and "'ip' binary" in text
        assert Network(1, "auto").mode == "loopback"
    finally:
        monkeypatch.undo()
        netns_missing.cache_clear()


def test_an_unprivileged_process_is_told_it_needs_cap_net_admin():
    if os.geteuid() != 0:
        missing = "; ".join(netns_missing())
    else:  # the probe, run by a forked child that dropped to nobody, must say what is missing
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                netns_missing.cache_clear()
                os.write(write_fd, "; ".join(netns_missing()).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            missing = pipe.read().decode()
        os.waitpid(pid, 0)
    assert "root/CAP_NET_ADMIN" in missing


def test_loopback_addresses_and_no_namespaces(loop):
    assert loop.mode == "loopback" and loop.enter(0) is None and loop.namespace(0) is None
    assert [loop.address(i) for i in range(3)] == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
    assert loop.store_address == "127.0.0.1"


def test_faults_in_loopback_mode_say_they_need_netns(loop):
    for fault in (lambda: loop.partition(0), lambda: loop.packet_loss(0, 0.1),
                  lambda: loop.bandwidth(0, "1mbit"), lambda: loop.link_down(0), loop.heal):
        with pytest.raises(ConfigError) as e:
            fault()
        assert "network='loopback' has no" in _one_line(e) and 'network="netns"' in str(e.value)


@pytest.mark.parametrize("call, message", [
    (lambda n: n.partition(3), "node=3 must be a node index in [0, 3)"),
    (lambda n: n.partition(True), "node=True must be a node index in [0, 3)"),
    (lambda n: n.partition(0, peers=[0, 1]), "peers=[0, 1] must not contain the partitioned node 0"),
    (lambda n: n.partition(0, peers=[5]), "peers=5 must be a node index in [0, 3)"),
    (lambda n: n.partition(0, peers=[]), 'peers=[] must be "all", "store" or a non-empty list of nodes'),
    (lambda n: n.partition(0, peers="everyone"), "peers='everyone' must be"),
    (lambda n: n.partition(0, direction="up"), "direction='up' must be \"both\", \"in\" or \"out\""),
    (lambda n: n.packet_loss(0, 1.5), "probability=1.5 must be in [0, 1]"),
    (lambda n: n.packet_loss(0, -0.1), "probability=-0.1 must be in [0, 1]"),
    (lambda n: n.packet_loss(0, "lots"), "probability='lots' must be a number in [0, 1]"),
    (lambda n: n.bandwidth(0, "fast"), "rate='fast' must be a rate like"),
    (lambda n: n.bandwidth(0, "0mbit"), "rate='0mbit' must be at least 8bit"),
    (lambda n: n.bandwidth(0, 1.5), "rate=1.5 must be a rate like"),
    (lambda n: n.link_down(-1), "node=-1 must be a node index in [0, 3)"),
    (lambda n: n.heal(7), "node=7 must be a node index in [0, 3)"),
])
def test_bad_inputs_are_one_line_config_errors(loop, call, message):
    with pytest.raises(ConfigError) as e:
        call(loop)
    assert _one_line(e).startswith(message)


def test_rules_render_drops_only_never_rejects():
    from harness.sim.net.rules import Loss, Partition

    script = render([Partition(("198.18.1.2",), "in"), Partition((), "out"), Loss(0.05)])
    assert "reject" not in script
    ingress, egress = script.split("chain egress")
    assert "ip saddr { 198.18.1.2 } drop" in ingress
    assert "meta protocol ip numgen random mod 10000 < 500 drop" in ingress
    assert "ip daddr" not in egress and "\t\tmeta protocol ip drop\n" in egress
    assert render([]) == "table netdev harness_faults\ndelete table netdev harness_faults\n"
