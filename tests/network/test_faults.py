"""Network faults on real sockets: silent partitions (no RST), directions, loss, bandwidth,
link down, and heal restoring each."""

from __future__ import annotations

import threading
import time

from tests.network.helpers import ARRIVES, QUIET, connect, delivered, listener, socket_in, udp_pair


def test_partition_drops_silently_and_heal_restores(net):
    server = listener(net, 1)
    target = server.getsockname()
    closed_port = (net.address(1), target[1] + 1)  # nobody listens: normally refused at once
    client = socket_in(net.enter(0))
    try:
        assert connect(net, 0, closed_port, ARRIVES) == "refused"
        client.settimeout(ARRIVES)
        client.connect(target)
        server.settimeout(ARRIVES)
        conn, _ = server.accept()

        change = net.partition(1, peers=[0])
        assert (change.kind, change.node, change.params) == ("partition", 1, {"peers": [0], "direction": "both"})
        assert change.at > 0 and change.monotonic > 0
        # silent: no RST for a closed port, no answer for an open one, nothing on an open connection
        assert connect(net, 0, closed_port, QUIET) == "timeout"
        assert connect(net, 0, target, QUIET) == "timeout"
        client.sendall(b"lost")
        conn.settimeout(QUIET)
        try:
            data = conn.recv(4)
        except TimeoutError:
            data = None
        assert data is None  # neither the bytes nor an EOF/RST got through
        assert connect(net, 2, target, ARRIVES) == "ok"  # only node 0 is cut off from node 1

        heal = net.heal(1)
        assert (heal.kind, heal.node, heal.params) == ("heal", 1, {"healed": ["partition/packet_loss"]})
        assert connect(net, 0, target, ARRIVES) == "ok"
        conn.settimeout(30)  # the held bytes arrive once TCP retransmits
        assert conn.recv(4) == b"lost"
        conn.close()
    finally:
        client.close()
        server.close()


def test_partition_from_the_store_or_from_everyone(net):
    node_server, store = listener(net, 1), listener(net, None)
    try:
        net.partition(0, peers="store")
        assert connect(net, 0, store.getsockname(), QUIET) == "timeout"
        assert connect(net, 0, node_server.getsockname(), ARRIVES) == "ok"
        net.partition(0, peers="all")
        assert connect(net, 0, node_server.getsockname(), QUIET) == "timeout"
        assert connect(net, 2, node_server.getsockname(), ARRIVES) == "ok"
        own = listener(net, 0)  # the node's own loopback traffic is never faulted
        try:
            local = socket_in(net.enter(0))
            local.settimeout(ARRIVES)
            local.connect(own.getsockname())  # via lo, not eth0
            local.close()
        finally:
            own.close()
        assert net.faulted() == {0: ["partition", "partition"]}
        net.heal()
        assert net.faulted() == {}
        assert connect(net, 0, store.getsockname(), ARRIVES) == "ok"
    finally:
        node_server.close()
        store.close()


def test_in_and_out_partitions_are_asymmetric(net):
    to_peer, at_peer = udp_pair(net, sender=1, receiver=0)
    from_peer, at_node = udp_pair(net, sender=0, receiver=1)
    try:
        assert delivered(to_peer, at_peer) == 1 and delivered(from_peer, at_node) == 1
        net.partition(1, peers=[0], direction="in")  # node 1 hears nothing from node 0
        assert delivered(to_peer, at_peer) == 1
        assert delivered(from_peer, at_node, wait=QUIET) == 0
        net.heal(1)
        net.partition(1, peers=[0], direction="out")  # node 0 hears nothing from node 1
        assert delivered(to_peer, at_peer, wait=QUIET) == 0
        assert delivered(from_peer, at_node) == 1
        net.heal(1)
        assert delivered(to_peer, at_peer) == 1 and delivered(from_peer, at_node) == 1
    finally:
        for sock in (to_peer, at_peer, from_peer, at_node):
            sock.close()


def test_packet_loss_drops_all_some_or_none(net):
    tx, rx = udp_pair(net, sender=0, receiver=1)
    try:
        change = net.packet_loss(0, 1.0)
        assert change.params == {"probability": 1.0}
        assert delivered(tx, rx, 50, wait=QUIET) == 0
        net.packet_loss(0, 0.5)  # replaces the earlier loss
        assert 0 < delivered(tx, rx, 400) < 400
        net.packet_loss(0, 0)
        assert net.faulted() == {}
        assert delivered(tx, rx, 50) == 50
    finally:
        tx.close()
        rx.close()


def _bytes_moved(net, window: float) -> int:
    """Bytes node 1 receives from node 0 in ``window`` seconds of node 0 sending flat out."""
    server = listener(net, 1)
    sender = socket_in(net.enter(0))
    stop = threading.Event()
    try:
        sender.settimeout(ARRIVES)
        sender.connect(server.getsockname())
        server.settimeout(ARRIVES)
        conn, _ = server.accept()

        def pump() -> None:
            sender.settimeout(0.2)
            chunk = b"x" * 65536
            while not stop.is_set():
                try:
                    sender.send(chunk)
                except TimeoutError:
                    continue
                except OSError:
                    return

        thread = threading.Thread(target=pump)
        thread.start()
        conn.settimeout(0.2)
        moved, deadline = 0, time.monotonic() + window
        while time.monotonic() < deadline:
            try:
                moved += len(conn.recv(1 << 20))
            except TimeoutError:
                pass
        stop.set()
        thread.join()
        conn.close()
        return moved
    finally:
        stop.set()
        sender.close()
        server.close()


def test_bandwidth_limits_a_transfer_by_orders_of_magnitude(net):
    free = _bytes_moved(net, 1.0)
    change = net.bandwidth(0, "1mbit")
    assert change.params == {"rate": "1mbit", "bits_per_second": 1_000_000}
    limited = _bytes_moved(net, 1.0)
    # 1 mbit/s is 125 kB/s: allow the bucket's burst and slack, but not another order
    assert limited < 1_250_000 < free, (limited, free)
    net.heal(0)
    assert _bytes_moved(net, 1.0) > 1_250_000


def test_link_down_cuts_the_cable_and_heal_plugs_it_back(net):
    server = listener(net, 1)
    try:
        assert connect(net, 0, server.getsockname(), ARRIVES) == "ok"
        assert net.link_down(1).kind == "link_down"
        assert connect(net, 0, server.getsockname(), QUIET) != "ok"
        assert net.heal(1).params == {"healed": ["link_down"]}
        assert connect(net, 0, server.getsockname(), ARRIVES) == "ok"
    finally:
        server.close()
