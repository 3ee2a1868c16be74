"""The liveness sockets are watched by a thread of their own: a peer whose process is gone
(its listener closed by the kernel) is news at once, for any number of peers, without the
agent or the keeper looking."""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import pytest

from harness.rendezvous import RendezvousParameters, get_rendezvous_handler
from harness.rendezvous._live_sockets import LiveSockets
from tests.rendezvous.conftest import form_round, free_port

#: generous: the news comes in milliseconds; this only bounds a test that would otherwise hang
NEWS_WITHIN = 15.0


def _listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener


def _handler(endpoint: str, run_id: str, host: bool, min_nodes: int = 2):
    """A c10d handler whose keeper looks at the store every 20 s (not within any test here)."""
    return get_rendezvous_handler(RendezvousParameters(
        "c10d", endpoint, run_id, min_nodes, 2, is_host=host, last_call_timeout=0.1,
        keep_alive_interval=20, heartbeat_timeout=60))


def _target(listener: socket.socket) -> str:
    return f"127.0.0.1:{listener.getsockname()[1]}"


def _until_connected(watcher, peer) -> None:
    """Until ``watcher``'s keeper holds a connection to ``peer``'s liveness socket (made at
    its first look at the round), or ``NEWS_WITHIN`` passed. Tried is not enough: a listener
    closed while the connection is being made refuses it, and a peer whose connection
    failed is judged by its heartbeat alone (which a test's live peer keeps beating)."""
    node = peer._keeper._node
    connected_by = time.monotonic() + NEWS_WITHIN
    while node not in watcher._keeper._live._socks and time.monotonic() < connected_by:
        time.sleep(0.01)


def test_a_peer_whose_process_is_gone_wakes_the_agent_before_any_look():
    """The keeper looks at the store every 20 s here; the peer's liveness listener closes
    (what the kernel does when its process dies). The agent's event fd turns readable long
    before the next look, and the membership has changed."""
    endpoint = f"127.0.0.1:{free_port()}"
    first, second = _handler(endpoint, "gone", True), _handler(endpoint, "gone", False)
    try:
        form_round(first, second)
        assert first.membership_changed() is False
        _until_connected(first, second)
        assert first._keeper.sock_dead() == set()
        news = first.event_fd()
        assert news is not None
        assert select.select([news], [], [], 0)[0] == []
        listener = second._keeper._listener
        assert listener is not None
        listener.close()  # the peer's process is gone, as far as its liveness socket tells
        assert select.select([news], [], [], NEWS_WITHIN)[0] == [news]
        assert first.membership_changed() is True
    finally:
        second.shutdown()
        first.shutdown()


def test_a_closed_peer_is_dead_past_select_s_1024_descriptors():
    """A process with many peers has sockets numbered past 1024, which ``select`` refuses:
    such a peer's death must still be seen."""
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    died = threading.Event()
    live = LiveSockets(lambda node: died.set(), "many")
    listener = _listener()
    try:
        live.connect("far", _target(listener))
        assert live.tried("far")
        assert max(fillers) > 1024
        assert live.dead() == set()
        listener.close()
        assert died.wait(NEWS_WITHIN)
        assert live.dead() == {"far"}
    finally:
        live.close()
        for fd in fillers:
            os.close(fd)


def test_bytes_from_a_peer_are_dropped_not_taken_for_its_death():
    """Nobody writes to a liveness socket; were a peer to, what it wrote is read and dropped
    (never interpreted), and only the connection's close is its death."""
    died = threading.Event()
    live = LiveSockets(lambda node: died.set(), "bytes")
    listener = _listener()
    try:
        live.connect("talker", _target(listener))
        accepted, _ = listener.accept()
        accepted.sendall(b"\x80\x04garbage")
        assert not died.wait(0.5)
        assert live.dead() == set()
        accepted.close()
        assert died.wait(NEWS_WITHIN)
        assert live.dead() == {"talker"}
    finally:
        listener.close()
        live.close()


def test_a_peer_that_refuses_is_tried_once_and_close_is_idempotent():
    live = LiveSockets(lambda node: None, "refused")
    listener = _listener()
    target = _target(listener)
    listener.close()  # nobody listens there now
    live.connect("nobody", target)
    assert live.tried("nobody")
    assert live.dead() == set()  # judged by its heartbeat alone
    live.close()
    live.close()
    live.connect("late", target)  # after close: nothing is opened
    assert not live.tried("late")


def test_a_shutdown_does_not_wait_out_the_keepers_store_wait():
    """The keeper waits on the store up to a keep-alive interval (20 s here): a node's
    shutdown cuts that wait short rather than sitting it out."""
    handler = _handler(f"127.0.0.1:{free_port()}", "quick", True, min_nodes=1)
    handler.next_rendezvous()
    thread = handler._keeper._thread
    assert thread is not None and thread.is_alive()
    began = time.monotonic()
    handler.shutdown()
    assert not thread.is_alive()
    assert time.monotonic() - began < 10  # its wait had up to 20 s left


def test_a_member_lost_before_the_ranks_are_assigned_abandons_the_round_not_the_job():
    """The survivor waits for the lost member's role (rank assignment): the wait gives up
    with ``RendezvousRoundAbandonedError``, on which the agent joins the next round, not a
    bare ``RendezvousError`` that ended the agent and, with it, the job."""
    from harness.agent import WorkerSpec
    from harness.agent._ranks import assign_worker_ranks
    from harness.rendezvous import RendezvousRoundAbandonedError

    endpoint = f"127.0.0.1:{free_port()}"
    first, second = (get_rendezvous_handler(RendezvousParameters("c10d", endpoint, "ranks", 2, 2, is_host=host,
                                                                 last_call_timeout=0.1))
                     for host in (True, False))  # the default keep-alive: the rank wait looks every 0.2 s
    try:
        info, _ = form_round(first, second)
        _until_connected(first, second)
        listener = second._keeper._listener
        assert listener is not None
        listener.close()  # the second node dies before it wrote its role
        spec = WorkerSpec(role="r", local_world_size=1, rdzv_handler=first, entrypoint="python")
        # bounded here (300 s by default): a wait that did not give up times out instead
        with pytest.raises(RendezvousRoundAbandonedError, match=f"in round {info.round}: lost "):
            assign_worker_ranks(info.store, info.rank, info.world_size, spec, identical=False,
                                timeout=NEWS_WITHIN)
    finally:
        second.shutdown()
        first.shutdown()
