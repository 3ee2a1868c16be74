"""``membership_changed(confirm=True)``: the agent saw workers fail, so the answer must
rest on news read after the failure, not on the keeper's last look (which packet loss can
make a whole keep-alive old): a peer that learnt of a joining node first may already have
stopped the workers ours were talking to."""

from __future__ import annotations

import socket
import time

from harness.rendezvous import RendezvousParameters, get_rendezvous_handler


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
