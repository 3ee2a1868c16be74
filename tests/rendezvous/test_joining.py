"""Nodes that ask to join a forming round are taken in by whichever node writes the state
next, over a real store: a round of many nodes forms in a few writes, not one per node."""

from __future__ import annotations

import threading

from harness.rendezvous._store import StoreServer
from tests.rendezvous.test_join_reads import _counted, _handler


def test_nodes_that_asked_are_taken_in_by_one_write_and_write_nothing_themselves():
    server = StoreServer("", 0).start()
    a, b, c = handlers = [_handler(server.port, "joining", 3) for _ in range(3)]
    try:
        counts = [_counted(h) for h in handlers]
        for asker in (b, c):  # what their next_rendezvous does first on a forming round
            asker._ask_to_join(0, asker._meta(), None)
        info_a = a.next_rendezvous()
        assert len(counts[0].cas_answers) == 1  # one write: all three in, the round full
        infos = [info_a, b.next_rendezvous(), c.next_rendezvous()]
        assert [len(count.cas_answers) for count in counts[1:]] == [0, 0]
        assert sorted(info.rank for info in infos) == [0, 1, 2]
        assert {info.world_size for info in infos} == {3}
    finally:
        for handler in handlers:
            handler.shutdown()
        server.stop()


def test_nodes_joining_at_once_form_their_round_in_two_writes():
    """Each node's first compare-and-set waits until all have asked (as 128 agents on two
    cores come to theirs together). The first to land takes in whom its writer had seen ask
    when it read the list; a node that lost reads the list again, all have asked by then, and
    its write takes in the rest and completes the full round. One join of its own per node
    wrote the state twelve times."""
    nodes = 12
    server = StoreServer("", 0).start()
    handlers = [_handler(server.port, "at-once", nodes) for _ in range(nodes)]
    all_asked = threading.Barrier(nodes, timeout=30)
    infos: list = []

    def join(handler):
        infos.append(handler.next_rendezvous())

    try:
        for count in [_counted(h) for h in handlers]:
            count.before_cas = all_asked.wait
        threads = [threading.Thread(target=join, args=(h,)) for h in handlers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(info.rank for info in infos) == list(range(nodes))
        assert handlers[0]._read()[1].seq <= 2  # the state was written at most twice
    finally:
        for handler in handlers:
            handler.shutdown()
        server.stop()
