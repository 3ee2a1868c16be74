"""Keep-alive expiry, fencing and "why is this round over" (``harness.rendezvous._liveness``)
on a fake clock."""

from __future__ import annotations

import pytest

from harness.rendezvous._api import RendezvousStateError
from harness.rendezvous._liveness import (
    KeepAliveLease,
    PeerWatch,
    StoreContact,
    change_reason,
    lease_text,
    leaving_members,
    parse_fences,
    parse_lease,
)
from harness.rendezvous._round import closed_state
from harness.rendezvous._state import RendezvousState, StoreKeys
from harness.timer import FakeClock

INTERVAL, TIMEOUT = 0.1, 0.8


def watch() -> tuple[FakeClock, PeerWatch]:
    clock = FakeClock()
    return clock, PeerWatch(clock, INTERVAL, TIMEOUT)


# -- peers' keep-alive expiry --------------------------------------------------------------


def test_a_peer_whose_counter_moves_stays_alive():
    clock, peers = watch()
    for beat in range(20):
        clock.advance(INTERVAL)
        verdict = peers.observe([("b", str(beat).encode())])
        assert not verdict.dead and not verdict.suspects


def test_the_peers_whose_lease_must_be_read_are_the_ones_standing_still():
    """A keep-alive reads a peer's published lease only while that peer's heartbeat stands
    still (then its silence may be judged, against its lease read fresh): a peer never seen,
    one whose counter did not move since the last look, one whose key is gone."""
    clock, peers = watch()
    first = [("b", b"1"), ("c", b"1"), ("d", b"1")]
    assert peers.unmoved(first) == ["b", "c", "d"], "never seen: all of them"
    peers.observe(first)
    clock.advance(INTERVAL)
    now = [("b", b"2"), ("c", b"1"), ("d", b"")]
    assert peers.unmoved(now) == ["c", "d"]
    peers.observe(now)
    assert peers.unmoved([("b", b"2"), ("c", b"2")]) == ["b"]


def test_a_silent_peer_is_suspect_then_dead_after_the_timeout():
    clock, peers = watch()
    peers.observe([("b", b"1")])
    clock.advance(0.2)
    assert not peers.observe([("b", b"1")]).suspects
    clock.advance(0.1)  # 0.3 s > 2.5 intervals
    verdict = peers.observe([("b", b"1")])
    assert verdict.suspects == {"b"} and not verdict.dead
    for _ in range(5):
        clock.advance(0.1)
        verdict = peers.observe([("b", b"1")])
    assert verdict.dead == {"b"} and not verdict.suspects  # 0.8 s of silence


def test_dead_exactly_at_the_bound_is_not_yet_dead():
    clock = FakeClock(start=0.0)
    peers = PeerWatch(clock, 0.125, 1.0)  # binary fractions: exact sums
    peers.observe([("b", b"1")])
    for _ in range(8):
        clock.advance(0.125)
        verdict = peers.observe([("b", b"1")])
    assert clock.now() == 1.0 and "b" not in verdict.dead  # strictly more than the bound
    clock.advance(0.125)
    assert "b" in peers.observe([("b", b"1")]).dead


def test_a_peer_is_heard_only_when_its_counter_moved_since_the_last_look():
    """Proof of life after a moment: the counter moved between two looks (a first look, a
    starved observer's reset and a vanished key are none)."""
    clock, peers = watch()
    assert peers.observe([("b", b"1")]).advanced == frozenset()  # first look: no baseline
    clock.advance(INTERVAL)
    assert peers.observe([("b", b"2")]).advanced == {"b"}
    clock.advance(INTERVAL)
    assert peers.observe([("b", b"2")]).advanced == frozenset()
    clock.advance(10 * TIMEOUT)  # starved: every clock restarts, but nothing moved
    assert peers.observe([("b", b"2")]).advanced == frozenset()
    assert peers.observe([("b", b"")]).advanced == frozenset()


def test_a_vanished_heartbeat_key_is_dead_at_once():
    _, peers = watch()
    assert peers.observe([("b", b"")]).dead == {"b"}


def test_a_starved_observer_does_not_blame_its_peers():
    clock, peers = watch()
    peers.observe([("b", b"1"), ("c", b"1")])
    clock.advance(5.0)  # our own thread did not run for 5 s
    verdict = peers.observe([("b", b"1"), ("c", b"1")])
    assert not verdict.dead and not verdict.suspects
    for beat in range(9):  # but a peer silent for the bound after that is dead
        clock.advance(0.1)
        verdict = peers.observe([("b", b"1"), ("c", str(beat).encode())])
    assert verdict.dead == {"b"}


def test_a_new_peer_starts_with_a_fresh_clock():
    clock, peers = watch()
    clock.advance(0.1)
    peers.observe([])
    clock.advance(0.1)
    assert not peers.observe([("late", b"7")]).dead


# -- fencing: this node's contact with the store -------------------------------------------


def test_fenced_once_silent_for_the_bound_and_a_request_went_unanswered():
    clock = FakeClock()
    contact = StoreContact(clock, TIMEOUT)
    clock.advance(0.5)
    assert not contact.failed() and not contact.fenced  # silent 0.5 s: not yet
    clock.advance(0.4)
    assert contact.failed() and contact.fenced and contact.fences == 1
    assert not contact.failed()  # a fence begins once
    assert contact.fences == 1


def test_silence_without_an_unanswered_request_fences_when_the_node_looks_again():
    """The lease runs out whether the store did not answer or this node did not ask: a
    node whose thread was not scheduled past the bound was as silent to its peers."""
    clock = FakeClock()
    contact = StoreContact(clock, TIMEOUT)
    clock.advance(0.6)
    assert not contact.lapsed() and not contact.fenced  # within its lease
    clock.advance(60.0)  # the thread did not even ask (starved)
    assert not contact.fenced  # nothing decides while nobody looks
    assert contact.lapsed() and contact.fenced and contact.fences == 1
    assert contact.ok()  # the next answer ends that fence


def test_an_answer_ends_the_fence_and_counts_it():
    clock = FakeClock()
    contact = StoreContact(clock, TIMEOUT)
    clock.advance(1.0)
    contact.failed()
    clock.advance(3.0)
    assert contact.silent_for() == 4.0
    assert contact.ok() and not contact.fenced and contact.silent_for() == 0.0
    clock.advance(0.5)
    assert not contact.failed()  # silence is counted from the last answer
    clock.advance(0.4)
    assert contact.failed() and contact.fences == 2


def test_an_infinite_bound_never_fences():
    clock = FakeClock()
    contact = StoreContact(clock, float("inf"))  # the agent that hosts the store
    clock.advance(1e6)
    assert not contact.failed() and not contact.fenced


# -- why the running round is over ---------------------------------------------------------


def running(**kw) -> RendezvousState:
    base = dict(run_id="j", round=2, complete=True, participants=["a", "b"],
                nodes={"a": {"name": "host-a"}, "b": {"name": "host-b"}})
    base.update(kw)
    return RendezvousState(**base)


def reason(state=None, **kw):
    args = dict(state=state or running(), running_round=2, running_members=["a", "b"],
                dead=set(), live_waiting=[], max_nodes=3)
    args.update(kw)
    return change_reason(**args)


def test_nothing_changed():
    assert reason() is None


def test_not_running_means_no_change():
    assert reason(running_round=None) is None
    assert change_reason(state=None, running_round=2, running_members=[], dead=set(),
                         live_waiting=[], max_nodes=2) is None


def test_each_reason_in_order_of_precedence():
    assert reason(store_lost="lost it", fenced="fenced: x") == "lost it"
    assert reason(fenced="fenced: x", dead={"b"}) == "fenced: x"
    assert "closed (over)" in reason(running(closed=True, close_reason="over"))
    assert reason(running(round=3, cause="leave")) == "round 3 began (leave)"
    assert reason(dead={"b"}) == "lost host-b"
    assert reason(live_waiting=["c"]) == "1 node(s) waiting to join"


def test_a_leaving_member_ends_the_round_found_in_the_state_or_as_the_caller_kept_it():
    state = running(nodes={"a": {"name": "host-a"}, "b": {"name": "host-b", "leaving": 3.0}})
    assert leaving_members(state, ["a", "b"]) == ["b"]
    assert reason(state) == "host-b is leaving"
    assert reason(state, leaving=["b"]) == "host-b is leaving"
    assert reason(state, leaving=[]) is None  # the caller's list is the word: not looked up again
    assert reason(state, for_barrier=True, leaving=["b"]) is None  # a barrier may still finish


def test_a_rendezvous_closed_by_a_node_that_finished_ends_no_running_round():
    # its exit barrier timed out first; the slower nodes run their workers to the end (as
    # under torch), whoever leaves after it; a wait in the round still gives up
    closed = closed_state(running(), "the job ended on host-a", finished="a")
    assert closed is not None and closed.closed_by_a_finished_node()
    assert reason(closed) is None
    assert reason(closed, dead={"a"}, live_waiting=["c"]) is None
    assert "closed (the job ended on host-a)" in reason(closed, for_barrier=True)
    # a node that gave up closes it without the mark: the others stop (unchanged)
    gave_up = closed_state(running(), "the job ended on host-a")
    assert gave_up is not None and not gave_up.closed_by_a_finished_node()
    assert "closed (the job ended on host-a)" in reason(gave_up)


def test_the_finished_mark_survives_the_wire():
    closed = closed_state(running(), "over", finished="a")
    assert closed is not None
    back = RendezvousState.from_json(closed.to_json(), "j", "test")
    assert back.closed_by_a_finished_node() and back.nodes["a"]["name"] == "host-a"


def test_a_member_announcing_its_leave_ends_the_running_round_but_no_wait_in_it():
    from harness.rendezvous._round import leaving_state

    leaving = leaving_state(running(), "b", 3.0)
    assert leaving is not None
    assert reason(leaving) == "host-b is leaving"
    assert reason(leaving, for_barrier=True) is None  # its workers may yet finish the round


def test_the_leaving_mark_survives_the_wire_and_garbage_in_it_is_refused():
    from harness.rendezvous._api import RendezvousStateError
    from harness.rendezvous._round import leaving_state

    leaving = leaving_state(running(), "b", 3.0)
    assert leaving is not None
    back = RendezvousState.from_json(leaving.to_json(), "j", "test")
    assert back.leaving("b") == 3.0 and back.leaving("a") is None
    for bad in (b'"leaving":"soon"', b'"leaving":true', b'"leaving":-1', b'"leaving":1e9',
                b'"leaving":NaN'):
        raw = leaving.to_json().replace(b'"leaving":3.0', bad)
        with pytest.raises(RendezvousStateError, match="leaving"):
            RendezvousState.from_json(raw, "j", "test")


def test_a_dead_node_outside_the_round_is_no_change():
    assert reason(dead={"z"}) is None


def test_waiting_nodes_do_not_count_at_max_nodes_or_in_a_barrier():
    assert reason(live_waiting=["c"], max_nodes=2) is None
    assert reason(live_waiting=["c"], for_barrier=True) is None
    assert reason(dead={"a"}, for_barrier=True) == "lost host-a"
    assert reason(fenced="fenced: x", for_barrier=True) == "fenced: x"


def test_request_timeout_ends_when_the_fence_is_due():
    clock = FakeClock()
    contact = StoreContact(clock, 0.7)
    assert contact.request_timeout(0.4) == 0.4  # plenty of time left
    clock.advance(0.5)
    assert abs(contact.request_timeout(0.4) - 0.2) < 1e-9  # only until the bound
    clock.advance(0.5)
    assert contact.request_timeout(0.4) == 0.05  # past it: the floor, to ask at all
    contact.failed()
    assert contact.request_timeout(0.4) == 0.4  # fenced: patient retries


def test_a_node_fences_a_keep_alive_interval_before_its_peers_can_declare_it_dead():
    """Same fake clock for one node's contact and its peer's watch: the node's last
    answered beat is what the peer saw last; the fence must come first."""
    clock = FakeClock()
    interval, timeout = 0.1, 0.8
    contact = StoreContact(clock, timeout - interval)  # what the handler uses
    peer = PeerWatch(clock, interval, timeout)
    peer.observe([("n", b"5")])  # the peer sees the node's last beat at once
    fenced_at = dead_at = None
    for tick in range(1, 20):
        clock.advance(0.05)
        if fenced_at is None and contact.failed():
            fenced_at = tick
        if dead_at is None and "n" in peer.observe([("n", b"5")]).dead:
            dead_at = tick
    assert fenced_at is not None and dead_at is not None and fenced_at < dead_at


# -- the lease grows with the gaps a node has shown ------------------------------------------


def test_a_quiet_node_keeps_the_configured_lease():
    clock = FakeClock()
    lease = KeepAliveLease(clock, base=0.7, cap=3.9)
    for _ in range(50):
        clock.advance(0.1)
        lease.beat()
    assert lease.seconds == 0.7  # 3 x 0.1 s is below the configured bound


def test_the_lease_grows_with_the_largest_recent_gap_and_decays_back():
    clock = FakeClock()
    lease = KeepAliveLease(clock, base=0.7, cap=3.9, margin=3.0, half_life=10.0)
    clock.advance(0.5)  # the host got busy: one beat 0.5 s after the last
    lease.beat()
    assert lease.seconds == pytest.approx(1.5)
    for _ in range(100):  # one half-life of quiet beats later
        clock.advance(0.1)
        lease.beat()
    assert lease.seconds == pytest.approx(0.75)  # 3 x 0.25 s: the peak halved
    for _ in range(100):
        clock.advance(0.1)
        lease.beat()
    assert lease.seconds == 0.7  # back to the configured bound


def test_the_stores_silence_does_not_grow_the_lease():
    """A partition is the store's silence, not this node's scheduling: the first one used to
    raise the lease to its cap, so the next partition took 4 s to detect, not 0.8 s."""
    clock = FakeClock()
    lease = KeepAliveLease(clock, base=0.7, cap=3.9)
    clock.advance(0.1)
    lease.beat()
    for _ in range(5):  # cut off: its requests go unanswered for 1.3 s
        clock.advance(0.26)
        lease.unanswered()
    lease.beat()  # healed: the first answer
    assert lease.seconds == 0.7
    clock.advance(0.5)  # the gap after it is this node's own again: learnt
    lease.beat()
    assert lease.seconds == pytest.approx(1.5)


def test_the_lease_never_passes_its_cap():
    clock = FakeClock()
    lease = KeepAliveLease(clock, base=0.7, cap=3.9)
    clock.advance(30.0)
    lease.beat()
    assert lease.seconds == 3.9


@pytest.mark.parametrize("raw, expected", [(b"1.500", 1.5), (b"", None), (b"nan-ish", None),
                                           (b"-1", None), (b"\xff", None), (b"1e9", None)])
def test_a_published_lease_is_read_or_ignored(raw, expected):
    assert parse_lease(raw) == expected


@pytest.mark.parametrize("seconds, fences, text", [(0.7, 0, "0.700"), (1.25, 3, "1.250 3")])
def test_a_lease_key_carries_the_fence_count_once_there_is_one(seconds, fences, text):
    assert lease_text(seconds, fences) == text
    raw = text.encode()
    assert (parse_lease(raw), parse_fences(raw)) == (pytest.approx(seconds), fences)


@pytest.mark.parametrize("raw", [b"", b"0.700", b"0.700 x", b"0.700 -1", b"0.700 1 2", b"\xff 1"])
def test_a_fence_count_missing_or_garbled_reads_as_none(raw):
    assert parse_fences(raw) == 0


def test_a_node_record_keeps_its_fence_count_and_refuses_a_bad_one():
    keys = StoreKeys("r", "host:1")
    state = RendezvousState(run_id="r", nodes={"a": {"name": "a", "fences": 2}, "b": {"name": "b"}})
    parsed = keys.parse(state.to_json())
    assert (parsed.fences("a"), parsed.fences("b")) == (2, 0)
    bad = RendezvousState(run_id="r", nodes={"a": {"name": "a", "fences": -1}})
    with pytest.raises(RendezvousStateError, match="-1 is not a non-negative int"):
        keys.parse(bad.to_json())


def test_a_peer_that_published_a_longer_lease_is_given_it():
    clock, peers = watch()
    peers.observe([("b", b"1"), ("c", b"1")], {"b": 1.5, "c": None})
    clock.advance(0.05)
    for _ in range(12):  # 1.2 s of silence from both, observed every 0.1 s
        clock.advance(0.1)
        verdict = peers.observe([("b", b"1"), ("c", b"1")], {"b": 1.5, "c": None})
    assert verdict.dead == {"c"}  # the configured bound (0.8 s)
    assert "b" in verdict.suspects  # its own: 1.5 s + one interval
    assert peers.longest == pytest.approx(1.6)
    for _ in range(5):
        clock.advance(0.1)
        verdict = peers.observe([("b", b"1")], {"b": 1.5})
    assert verdict.dead == {"b"}


def test_a_lease_shorter_than_the_configured_bound_changes_nothing():
    _, peers = watch()
    assert peers.bound(0.1) == TIMEOUT and peers.bound(None) == TIMEOUT
