"""A peer fenced for a moment is news to the nodes of its round, even when its heartbeat
moves on before its rejoin reaches the state.

Two handlers on a real store, b's traffic through a relay the test freezes (SIGSTOP: no
answer, no RST, no FIN). b is cut off past its own lease (0.7 s) and fences; a allows a
peer ten seconds of silence, so it never declares b dead. Once the relay thaws, b's
keep-alive answers and its heartbeat moves on; b does not rejoin (no agent drives it). a,
asked after its workers failed (``confirm``), hears b alive and sees the same round: only
the fence count b's lease key carries tells it that b's workers stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.rendezvous import RendezvousParameters
from harness.rendezvous._c10d import C10dRendezvousHandler
from harness.rendezvous._store import StoreServer
from tests.rendezvous.store_proc import proxy_to


def _handler(port: int, **conf: Any) -> C10dRendezvousHandler:
    return C10dRendezvousHandler(RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", "blip", 2, 2, is_host=False, **conf))


def _both_rendezvous(a: C10dRendezvousHandler, b: C10dRendezvousHandler) -> None:
    """One round of both (a join blocks until the round of two is complete)."""
    errors: list[BaseException] = []

    def join() -> None:
        try:
            b.next_rendezvous()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    other = threading.Thread(target=join)
    other.start()
    a.next_rendezvous()
    other.join(30)
    assert not other.is_alive() and not errors, errors


def _until(done: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_a_peer_that_fenced_after_the_round_began_changed_it(caplog):
    server = StoreServer("127.0.0.1", 0).start()
    with proxy_to(server.port) as relay:
        a = _handler(server.port, heartbeat_timeout=10)
        b = _handler(relay.port)
        try:
            _both_rendezvous(a, b)
            assert not a.membership_changed(confirm=True)  # nothing happened yet

            relay.freeze()
            try:
                _until(lambda: b.fence_reason() is not None, "b fenced")
            finally:
                relay.thaw()
            _until(lambda: b.wait_unfenced(0.1), "the store answered b again")
            assert a.membership_changed(confirm=True)  # b heard alive, the state as it was
            assert "fenced (cut off from the store) after the round began" in caplog.text

            caplog.clear()
            _both_rendezvous(a, b)  # b rejoins: its record counts the fence
            assert not a.membership_changed(confirm=True), caplog.text
        finally:
            b.shutdown()
            a.shutdown()
            server.stop()


def test_a_peer_that_never_fenced_publishes_a_lease_alone():
    """The count is written only once there is one: a lease key reads as before."""
    server = StoreServer("127.0.0.1", 0).start()
    a, b = _handler(server.port), _handler(server.port)
    try:
        _both_rendezvous(a, b)
        client = a._store.client
        leases = client.peek_many([a._keys.lease(n) for n in (a._node, b._node)])
        assert all(raw.count(b" ") == 0 and float(raw) > 0 for raw in leases), leases
    finally:
        b.shutdown()
        a.shutdown()
        server.stop()


logging.getLogger("harness.rendezvous").setLevel(logging.INFO)
