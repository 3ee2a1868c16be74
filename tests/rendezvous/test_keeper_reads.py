"""What the keep-alive thread reads from the store: the state document is parsed again only
when its bytes changed (every keep-alive reads it; at 128 nodes a parse is a quarter of a
keep-alive's work), and keys it has read once are read without torch's wait for them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from harness.rendezvous import RendezvousParameters, get_rendezvous_handler
from tests.rendezvous.conftest import form_round, free_port

#: generous: keep-alives come every 0.1 s; this only bounds a test that would otherwise hang
WITHIN = 15.0


def _beats_after(keeper, count: int) -> None:
    """Until ``count`` more keep-alives began (each re-reads the state)."""
    seen, began = 0, keeper._beat_began
    deadline = time.monotonic() + WITHIN
    while seen < count:
        assert time.monotonic() < deadline, f"fewer than {count} keep-alives in {WITHIN}s"
        time.sleep(0.02)
        if keeper._beat_began != began:
            seen, began = seen + 1, keeper._beat_began


@contextmanager
def _a_round_of_two(run_id: str) -> Iterator[tuple[Any, Any]]:
    """Two handlers in one round: the first hosts the store."""
    endpoint = f"127.0.0.1:{free_port()}"
    first, second = (get_rendezvous_handler(RendezvousParameters("c10d", endpoint, run_id, 2, 2, is_host=host,
                                                                 last_call_timeout=0.1))
                     for host in (True, False))
    try:
        form_round(first, second)
        yield first, second
    finally:
        second.shutdown()
        first.shutdown()


def test_the_same_state_bytes_are_parsed_once_and_a_change_is_read_at_once():
    with _a_round_of_two("reads") as (first, second):
        keeper = first._keeper
        _beats_after(keeper, 1)
        kept = keeper.snapshot()
        assert kept is not None and not kept.closed
        _beats_after(keeper, 3)
        assert keeper.snapshot() is kept  # read three times, parsed once
        second.set_closed("done")
        deadline = time.monotonic() + WITHIN
        while not keeper.snapshot().closed:  # the change wakes the keeper: a fresh parse
            assert time.monotonic() < deadline, "the keeper never read the closed state"
            time.sleep(0.02)
        assert keeper.snapshot() is not kept and keeper.snapshot().close_reason.startswith("done")


def test_a_keep_alive_waits_only_for_news_not_for_keys_it_has_read():
    """Each keep-alive reads the state and the peers' heartbeats; once it has read them,
    it knows they exist and reads them without a WAIT first, in the request that bumps its
    heartbeat. What is left is one WAIT per keep-alive: the one for the state's next change."""
    with _a_round_of_two("peeks") as (first, _):
        server = first._store.server
        _beats_after(first._keeper, 2)
        before = server.served()
        _beats_after(first._keeper, 5)
        after = server.served()
        served = {op: after.get(op, 0) - before.get(op, 0) for op in ("ADD", "WAIT", "MULTI_GET", "GET")}
        # two keepers beat: an ADD each per keep-alive, and a WAIT each for the next change
        assert served["ADD"] >= 8 and served["MULTI_GET"] >= 8, served
        assert served["WAIT"] <= served["ADD"] + 2, served  # with a wait before each read: 3 per ADD
        assert served["GET"] <= 2, served  # the state is read with the heartbeats (one MULTI_GET)
