"""``membership_changed(confirm=True)``: the agent saw workers fail, so the answer must
rest on news read after the failure, not on the keeper's last look (which packet loss can
make a whole keep-alive old): a peer that learnt of a joining node first may already have
stopped the workers ours were talking to."""

from __future__ import annotations

import socket
import time

from harness.rendezvous import RendezvousParameters, get_rendezvous_handler
from tests.rendezvous.conftest import form_round


def test_confirm_answers_from_a_keep_alive_begun_after_the_call():
    with socket.socket() as probe:  # a free port: the node hosts the store there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "confirm", 1, 2, is_host=True,
                                  last_call_timeout=0.1, keep_alive_interval=0.5,
                                  heartbeat_timeout=3)
    handler = get_rendezvous_handler(params)
    try:
        handler.next_rendezvous()
        asked = time.monotonic()
        assert handler.membership_changed() is False  # cheap: what the keeper last saw
        assert handler._keeper.snapshot_read_at < asked  # the keeper sits in its 0.5 s wait
        asked = time.monotonic()
        assert handler.membership_changed(confirm=True) is False
        assert handler._keeper.snapshot_read_at >= asked
    finally:
        handler.shutdown()


def test_confirm_waits_to_hear_every_peer_alive_after_the_failure():
    """A peer that died with nothing seen yet (its liveness socket's FIN lost on a lossy link
    and not yet retransmitted; its heartbeat not late yet) must not make a failure it caused
    a restart: the answer waits until every peer of the round is heard alive after the call,
    and a peer that is not is dead by the bound (seen under chaos: packet loss on the
    survivor, the scenario's node kill charged as the job's only restart)."""
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def handler(host: bool):
        return get_rendezvous_handler(RendezvousParameters(
            "c10d", f"127.0.0.1:{port}", "heard", 2, 2, is_host=host, last_call_timeout=0.1,
            keep_alive_interval=0.1, heartbeat_timeout=0.8))

    first = handler(True)
    second = handler(False)
    silent = threading.Event()
    try:
        form_round(first, second)
        asked = time.monotonic()
        assert first.membership_changed(confirm=True) is False  # the peer is heard: a plain failure
        assert time.monotonic() - asked < 0.8
        keeper = second._keeper
        keeper._beat = lambda client, peers: (silent.wait(30), 0)[1]  # alive to its socket, silent in the store
        time.sleep(0.05)  # its beat in flight, or about to be: its heartbeat stops moving
        asked = time.monotonic()
        assert first.membership_changed(confirm=True) is True  # not charged: the peer is gone
        assert time.monotonic() - asked >= 0.5  # it waited to hear the peer, until the peer was dead
    finally:
        silent.set()
        second.shutdown()
        first.shutdown()
