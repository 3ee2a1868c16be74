"""The c10d round state machine (``harness.rendezvous._round``) on a fake clock.

Several nodes share one ``RendezvousState`` here exactly as they do through the store:
each reads the current state, decides, and its write (if any) becomes the new state.
"""

from __future__ import annotations

import pytest

from harness.rendezvous._round import (
    LEAVE_SLACK,
    RECOVERY_LAST_CALL,
    RECOVERY_LAST_CALL_PER_NODE,
    RoundMachine,
    RoundRules,
    Step,
    closed_state,
    complete_round,
    leaving_state,
    withdrawn_state,
)
from harness.rendezvous._state import RendezvousState
from harness.timer import FakeClock


class World:
    """Nodes sharing one state, as through the store (writes are applied in order)."""

    def __init__(self, rules: RoundRules):
        self.clock = FakeClock()
        self.rules = rules
        self.state = RendezvousState(run_id="job")
        self.machines: dict[str, RoundMachine] = {}
        self.dead: set[str] = set()

    def node(self, name: str) -> RoundMachine:
        machine = RoundMachine(name, self.rules, self.clock)
        self.machines[name] = machine
        return machine

    def step(self, name: str) -> Step:
        """One read-decide-write of ``name``; returns what it decided."""
        step = self.machines[name].step(self.state, self.dead, {"name": name, "addr": "h"})
        if step.kind == "write":
            assert step.state is not None
            step.state.seq = self.state.seq + 1
            self.state = step.state
        if step.kind == "finish":
            self.machines[name].finished(self.state)
        return step

    def start(self, *names: str) -> None:
        """Agents start (``next_rendezvous`` begins) at this clock reading."""
        for name in names:
            self.node(name).begin()

    def again(self, *names: str) -> None:
        """Running nodes call ``next_rendezvous`` again (restart, change)."""
        for name in names:
            self.machines[name].begin()

    def alone(self, name: str) -> None:
        """``name`` forms round 0 by itself once the last call ran out, and runs it."""
        self.start(name)
        self.step(name)
        self.step(name)
        self.clock.advance(self.rules.last_call_for(0) + 0.5)
        assert self.step(name).kind == "write" and self.state.complete
        assert self.step(name).kind == "finish"

    def settle(self, *names: str, limit: int = 20) -> dict[str, str]:
        """Step every node until none writes; a node that finished its round stops
        (its agent would now run workers). Each node's last decision."""
        last: dict[str, str] = {}
        for _ in range(limit):
            wrote = False
            for name in names:
                if last.get(name) == "finish":
                    continue
                step = self.step(name)
                last[name] = step.kind
                wrote |= step.kind == "write"
            if not wrote:
                return last
        raise AssertionError(f"no fixed point after {limit} passes: {self.state}")


def rules(min_nodes: int = 1, max_nodes: int = 2, last_call: float = 30.0) -> RoundRules:
    return RoundRules(min_nodes=min_nodes, max_nodes=max_nodes, last_call_timeout=last_call,
                      join_timeout=600.0, poll=0.2)


def form(world: World, *names: str) -> None:
    world.start(*names)
    assert set(world.settle(*names).values()) == {"finish"}, world.state


# -- first formation -------------------------------------------------------------------


def test_round_closes_as_soon_as_max_nodes_joined():
    w = World(rules(1, 2))
    w.start("a", "b")
    assert w.step("a").kind == "write"  # a joins
    assert not w.state.complete
    assert w.step("b").kind == "write"  # b joins: max reached, complete at once
    assert w.state.complete and w.state.participants == ["a", "b"]
    assert w.step("a").kind == "finish" and w.step("b").kind == "finish"


def test_first_round_waits_the_full_last_call_for_staggered_starts():
    w = World(rules(1, 2, last_call=30.0))
    w.start("a")
    w.step("a")  # joins; min reached: the last call starts
    step = w.step("a")
    assert step.kind == "wait" and step.wait_for <= 0.2
    w.clock.advance(2.0)  # b starts two seconds later
    assert w.step("a").kind == "wait" and not w.state.complete
    w.start("b")
    w.settle("a", "b")
    assert w.state.complete and w.state.participants == ["a", "b"]


def test_first_round_last_call_closes_a_lone_node_when_it_runs_out():
    w = World(rules(1, 3, last_call=30.0))
    w.start("a")
    w.step("a")
    w.step("a")
    w.clock.advance(29.9)
    assert w.step("a").kind == "wait"
    assert w.machines["a"].last_call_left(w.state) == pytest.approx(0.1)
    w.clock.advance(0.2)
    assert w.step("a").kind == "write" and w.state.complete
    assert w.state.participants == ["a"]


def test_last_call_wait_is_never_longer_than_what_is_left():
    w = World(rules(1, 3, last_call=0.05))
    w.start("a")
    w.step("a")
    step = w.step("a")
    assert step.kind == "wait" and step.wait_for == pytest.approx(0.05)


def test_a_short_configured_last_call_applies_to_the_first_round():
    w = World(rules(1, 3, last_call=1.0))
    w.alone("a")
    assert w.clock.now() == 1001.5


def test_no_last_call_below_min_nodes():
    w = World(rules(2, 3, last_call=1.0))
    w.start("a")
    w.step("a")
    w.clock.advance(100.0)
    assert w.step("a").kind == "wait"  # alone, below min: waits however long
    assert w.machines["a"].last_call_left(w.state) is None
    w.start("b")
    w.step("b")
    assert w.step("a").kind == "wait"  # the last call starts only now
    w.clock.advance(1.01)
    assert w.step("a").kind == "write" and w.state.complete


def test_join_timeout():
    w = World(rules(2, 2))
    w.start("a")
    w.step("a")
    w.clock.advance(600.1)
    assert w.step("a").kind == "timeout"


def test_closed_rendezvous_is_reported_to_a_late_node():
    w = World(rules(1, 2))
    w.state = closed_state(w.state, "the job ended on x")
    w.start("late")
    assert w.step("late").kind == "closed"


# -- a running job: newcomers, restarts, losses ----------------------------------------


def test_newcomer_joins_a_running_round_via_the_waiting_list():
    w = World(rules(1, 3, last_call=1.0))
    w.alone("a")
    w.start("b")
    assert w.step("b").kind == "write" and w.state.waiting == ["b"]
    assert w.step("b").kind == "wait"  # on the waiting list, nothing to do
    # a sees the waiting node (the handler's membership_changed) and re-rendezvous
    w.again("a")
    assert w.step("a").kind == "write"
    assert w.state.round == 1 and w.state.expected == ["a", "b"] and w.state.cause == "join"
    assert w.step("b").kind == "write"  # joins (a joiner completes only at max_nodes)
    assert w.step("b").kind == "write"  # every expected node is in: complete, no last call
    assert w.state.complete and w.state.participants == ["a", "b"]
    assert w.clock.now() == 1001.5


def test_a_waiting_node_opens_the_next_round_once_every_node_of_the_running_one_is_dead():
    """A late joiner on the waiting list whose running round's nodes all died (a node added
    the moment the only one was killed) is not left waiting for a re-rendezvous nobody will
    start: it opens the next round, and with every node it expects in (itself), completes."""
    w = World(rules(1, 2, last_call=1.0))
    w.alone("a")
    w.start("b")
    assert w.step("b").kind == "write" and w.state.waiting == ["b"]
    assert w.step("b").kind == "wait"  # a lives: a re-rendezvous is a's to start
    w.dead = {"a"}
    assert w.step("b").kind == "write"
    assert (w.state.round, w.state.cause, w.state.expected, w.state.participants) == (1, "death", ["b"], ["b"])
    assert w.step("b").kind == "write" and w.state.complete and w.state.participants == ["b"]
    assert w.step("b").kind == "finish"


def test_restart_round_closes_once_every_survivor_rejoined():
    w = World(rules(1, 2))
    form(w, "a", "b")
    w.again("a", "b")
    assert w.step("b").kind == "write"  # b opens round 1
    assert w.state.cause == "restart" and w.state.participants == ["b"]
    w.step("a")
    assert w.state.complete and w.state.round == 1
    assert w.state.participants == ["a", "b"]  # old order kept: ranks stay stable


def test_node_loss_round_closes_without_waiting_for_the_dead():
    w = World(rules(1, 3, last_call=30.0))
    w.start("a", "b", "c")
    assert set(w.settle("a", "b", "c").values()) == {"finish"}
    w.dead = {"c"}
    w.again("a", "b")
    w.step("a")
    assert w.state.cause == "death" and w.state.expected == ["a", "b"]
    w.step("b")  # joins
    w.step("b")  # every live expected node is in: complete
    assert w.state.complete and w.state.participants == ["a", "b"]
    assert w.clock.now() == 1000.0  # no time passed: no last call was waited for


def test_an_expected_node_that_dies_while_the_round_forms_is_dropped():
    w = World(rules(1, 3, last_call=30.0))
    w.start("a", "b", "c")
    assert set(w.settle("a", "b", "c").values()) == {"finish"}
    w.again("a", "b", "c")
    w.step("a")  # opens round 1 expecting a, b, c
    w.step("b")
    assert not w.state.complete
    w.dead = {"c"}
    assert w.step("a").kind == "write" and w.state.expected == ["a", "b"]
    w.step("a")
    assert w.state.complete and w.state.participants == ["a", "b"]


def test_later_rounds_wait_at_most_the_recovery_last_call_for_slow_survivors():
    w = World(rules(1, 3, last_call=30.0))
    w.start("a", "b", "c")
    assert set(w.settle("a", "b", "c").values()) == {"finish"}
    w.again("a")
    w.step("a")  # round 1 expects a, b, c; b and c are alive but slow
    assert w.step("a").kind == "wait"
    assert w.machines["a"].last_call_left(w.state) == pytest.approx(RECOVERY_LAST_CALL)
    w.clock.advance(RECOVERY_LAST_CALL + 0.01)
    w.step("a")
    assert w.state.complete and w.state.participants == ["a"]
    assert w.rules.last_call_for(0) == 30.0 and w.rules.last_call_for(1) == RECOVERY_LAST_CALL


def test_a_later_round_waits_while_its_expected_nodes_keep_joining():
    """128 agents several times slower than usual rejoined over more than the window: every
    round closed with a part of them, the rest went on the waiting list and the next change
    restarted everyone, for ever. The window runs from the latest join: five survivors
    coming 0.8 s apart (3.2 s in all, past the 1 s window) are all in the round."""
    names = ["a", "b", "c", "d", "e"]
    w = World(rules(1, 5, last_call=30.0))
    form(w, *names)
    w.again(*names)
    w.step("a")  # opens round 1, expecting all five
    assert w.state.round == 1 and not w.state.complete
    for name in names[1:]:
        w.clock.advance(0.8)
        assert w.step("a").kind == "wait"  # 0.8 s since the latest join: not yet
        w.step(name)
    w.step("a")
    assert w.state.complete and w.state.participants == names


def test_a_later_round_closes_once_joins_stop_for_the_window():
    """A survivor alive but stuck is waited for the window since the latest join, no longer."""
    w = World(rules(1, 3, last_call=30.0))
    form(w, "a", "b", "c")
    w.again("a", "b")
    w.step("a")  # opens round 1
    assert w.step("a").kind == "wait"  # a is in: its last call starts
    w.clock.advance(0.8)
    w.step("b")  # b joins 0.8 s in: c is alive, and stuck
    assert w.step("a").kind == "wait"  # a wakes on the change and sees b in
    w.clock.advance(RECOVERY_LAST_CALL - 0.01)
    assert w.step("a").kind == "wait" and not w.state.complete  # 1.79 s in: a 1 s window from the start is past
    w.clock.advance(0.02)
    w.step("a")
    assert w.state.complete and w.state.participants == ["a", "b"]


def test_torchs_first_round_counts_its_last_call_from_min_nodes_however_many_join_after():
    """Without ``first_round_nodes`` the first round does not know whom it waits for: its
    last call is torch's, from the moment ``min_nodes`` were in."""
    w = World(rules(1, 4, last_call=2.0))
    w.start("a", "b", "c")
    w.step("a")
    w.step("a")  # a is in: the last call starts
    w.clock.advance(1.5)
    w.step("b")
    w.clock.advance(0.6)  # 2.1 s since a, 0.6 s since b
    w.step("a")
    assert w.state.complete and w.state.participants == ["a", "b"]


def test_the_first_round_closes_the_moment_every_node_the_launcher_started_is_in():
    """64 nodes on 2 cores came over 3 s: with a 1 s last call the first round closed with 33,
    and the other 31 made a second at once. The launcher gives a last call long enough for
    them all, and, told how many it started, the round closes the moment the last is in
    instead of waiting that last call out (fewer than max_nodes)."""
    w = World(RoundRules(min_nodes=1, max_nodes=8, last_call_timeout=6.0, first_round_nodes=5))
    w.start("a", "b", "c", "d", "e")
    for name in "abcd":
        w.step(name)
        w.clock.advance(1.2)  # each comes more than a second after the one before
    assert w.step("a").kind == "wait" and not w.state.complete
    w.step("e")
    w.step("a")
    assert w.state.complete and w.state.participants == ["a", "b", "c", "d", "e"]


def test_the_first_round_still_closes_on_its_last_call_when_a_started_node_never_comes():
    w = World(RoundRules(min_nodes=1, max_nodes=8, last_call_timeout=2.0, first_round_nodes=3))
    w.start("a", "b")
    w.step("a")
    w.step("b")
    w.step("a")
    w.clock.advance(2.01)
    w.step("a")
    assert w.state.complete and w.state.participants == ["a", "b"]


def test_a_recovery_round_waits_longer_for_many_expected_survivors():
    """Survivors stop their workers and rejoin one after another on a loaded machine: a
    round expecting many waits longer for the last of them."""
    r = rules(last_call=30.0)
    assert r.last_call_for(1, expecting=2) == RECOVERY_LAST_CALL
    assert r.last_call_for(1, expecting=64) == pytest.approx(64 * RECOVERY_LAST_CALL_PER_NODE)
    assert rules(last_call=3.0).last_call_for(1, expecting=64) == 3.0


def test_recovery_last_call_never_exceeds_a_shorter_configured_one():
    assert rules(last_call=0.3).last_call_for(5) == 0.3


def test_a_participant_does_not_finish_the_same_round_twice():
    w = World(rules(1, 2))
    form(w, "a", "b")
    w.again("a")
    step = w.step("a")  # a ran round 0 already: it must open round 1, not return round 0
    assert step.kind == "write" and w.state.round == 1


def test_a_dead_waiting_node_is_not_expected_in_the_next_round():
    w = World(rules(1, 3, last_call=1.0))
    w.alone("a")
    w.start("b")
    w.step("b")
    w.dead = {"b"}
    w.again("a")
    w.step("a")
    assert w.state.expected == ["a"] and w.state.cause == "restart"


# -- the job's restart count ---------------------------------------------------------------


def charge(world: World, *names: str) -> None:
    """``names``' workers failed on their own in the round they run: their agents charge
    it (``charge_restart``) and call ``next_rendezvous``."""
    for name in names:
        world.machines[name].charge_failure(world.state.restarts)
    world.again(*names)


def test_a_failure_seen_by_every_node_of_the_round_counts_once():
    w = World(rules(2, 2))
    form(w, "a", "b")
    charge(w, "a", "b")  # a collective failed on both nodes: both charge round 0
    assert set(w.settle("a", "b").values()) == {"finish"}
    assert (w.state.round, w.state.restarts) == (1, 1)
    charge(w, "b", "a")  # the next failure, opened by the other node this time
    w.settle("a", "b")
    assert (w.state.round, w.state.restarts) == (2, 2)


def test_a_node_that_only_reforms_gets_the_count_the_failed_node_charged():
    w = World(rules(2, 2))
    form(w, "a", "b")
    charge(w, "a")  # a's worker failed; b re-forms (a membership change for it)
    assert w.step("a").kind == "write" and w.state.restarts == 1 and not w.state.complete
    w.again("b")
    assert set(w.settle("a", "b").values()) == {"finish"}
    assert w.state.complete and w.state.restarts == 1


def test_the_charge_lands_on_the_join_when_another_node_opened_the_round():
    w = World(rules(2, 2))
    form(w, "a", "b")
    w.again("b")
    w.step("b")  # b opens round 1 (it saw the change first): no charge of its own
    assert w.state.round == 1 and w.state.restarts == 0
    charge(w, "a")
    w.settle("a", "b")
    assert w.state.complete and w.state.restarts == 1


def test_membership_changes_use_no_restart():
    w = World(rules(1, 2, last_call=1.0))
    form(w, "a", "b")
    w.dead = {"b"}
    w.again("a")
    w.settle("a")
    w.start("c")
    w.step("c")  # waits
    w.again("a")
    w.settle("a", "c")
    assert w.state.round == 2 and w.state.participants == ["a", "c"] and w.state.restarts == 0


def test_a_complete_rounds_count_is_fixed_a_waiting_nodes_charge_waits():
    w = World(rules(1, 2, last_call=1.0))
    form(w, "a", "b")
    w.dead = {"b"}  # b is slow: round 1 forms without it
    charge(w, "b")
    w.again("a")
    w.settle("a")
    assert w.state.complete and w.state.participants == ["a"] and w.state.restarts == 0
    w.dead = set()
    assert w.step("b").kind == "write" and w.state.waiting == ["b"]
    assert w.state.restarts == 0  # round 1 runs with 0 on a: it stays 0
    w.again("a")
    w.settle("a", "b")
    assert w.state.round == 2 and w.state.restarts == 1


def test_a_fresh_node_reads_the_count_and_cannot_lower_it():
    """pytorch#147064: a node that exits and comes back at once must not bring a fresh
    budget. Its machine is new (nothing owed); the count is the job's."""
    w = World(rules(1, 2, last_call=1.0))
    form(w, "a", "b")
    charge(w, "a")
    w.again("b")
    w.settle("a", "b")
    assert w.state.restarts == 1
    w.dead = {"b"}
    w.again("a")
    w.settle("a")
    w.dead = set()
    w.start("b2")  # b again, as a fresh agent
    w.step("b2")
    w.again("a")
    w.settle("a", "b2")
    assert w.state.participants == ["a", "b2"] and w.state.restarts == 1


def test_a_late_charge_for_an_older_round_adds_nothing():
    w = World(rules(2, 2))
    form(w, "a", "b")
    w.state.restarts = 3
    w.machines["a"].charge_failure(1)  # "I ran with 1": the job is past that already
    w.again("a", "b")
    w.settle("a", "b")
    assert w.state.restarts == 3


def test_a_leave_keeps_the_count():
    state = RendezvousState(run_id="j", round=3, complete=True, participants=["a", "b"],
                            restarts=2)
    new = withdrawn_state(state, "b", leaving=True)
    assert new is not None and new.restarts == 2


# -- a graceful leave, two phases --------------------------------------------------------


def _announce(w: World, node: str, grace: float) -> None:
    new = leaving_state(w.state, node, grace)
    assert new is not None
    new.seq = w.state.seq + 1
    w.state = new


def test_no_round_forms_while_a_leaver_may_still_have_workers():
    """b announced its leave: a stops its workers and calls next_rendezvous, but opens no
    round (its workers would meet b's still-stopping ones) until b withdraws."""
    w = World(rules(1, 2))
    form(w, "a", "b")
    _announce(w, "b", grace=3.0)
    w.again("a")
    w.clock.advance(2.0)
    assert w.step("a").kind == "wait" and w.state.round == 0
    new = withdrawn_state(w.state, "b", leaving=True)
    assert new is not None
    w.state = new
    assert w.settle("a") == {"a": "finish"}
    assert (w.state.round, w.state.cause, w.state.participants) == (1, "leave", ["a"])
    assert w.state.restarts == 0


def test_a_leaver_known_dead_is_not_waited_for():
    w = World(rules(1, 2))
    form(w, "a", "b")
    _announce(w, "b", grace=3.0)
    w.dead = {"b"}
    w.again("a")
    assert w.settle("a") == {"a": "finish"}
    assert (w.state.round, w.state.cause, w.state.participants) == (1, "death", ["a"])


def test_a_leaver_that_overstays_its_grace_is_counted_dead():
    """Its agent SIGKILLs its workers when the grace runs out: past grace + slack (on the
    waiter's own clock, from when it first saw the leave) nothing of it can be running."""
    w = World(rules(1, 2))
    form(w, "a", "b")
    _announce(w, "b", grace=3.0)
    w.again("a")
    assert w.step("a").kind == "wait"
    w.clock.advance(3.0 + LEAVE_SLACK - 0.1)
    assert w.step("a").kind == "wait"
    w.clock.advance(0.2)
    assert w.settle("a") == {"a": "finish"}
    assert (w.state.round, w.state.cause, w.state.participants) == (1, "death", ["a"])


def test_a_leave_is_announced_once_and_only_by_a_member_of_a_running_round():
    running = RendezvousState(run_id="j", round=1, complete=True, participants=["a", "b"],
                              nodes={"a": {"name": "a"}, "b": {"name": "b"}})
    new = leaving_state(running, "b", 3.0)
    assert new is not None and new.leaving("b") == 3.0 and new.nodes["b"]["name"] == "b"
    assert running.leaving("b") is None  # the input is never modified
    assert leaving_state(new, "b", 3.0) is None
    assert leaving_state(running, "z", 3.0) is None
    forming = RendezvousState(run_id="j", round=1, participants=["a", "b"])
    assert leaving_state(forming, "b", 3.0) is None
    assert leaving_state(closed_state(running, "over") or running, "b", 3.0) is None


# -- pure transitions --------------------------------------------------------------------


def test_complete_round_puts_expected_first_then_newcomers_in_join_order():
    state = RendezvousState(run_id="j", participants=["new1", "b", "new2", "a"],
                            expected=["a", "b"])
    complete_round(state)
    assert state.participants == ["a", "b", "new1", "new2"]
    assert state.complete and state.expected == []


def test_closed_state_is_idempotent():
    state = RendezvousState(run_id="j")
    closed = closed_state(state, "over")
    assert closed is not None and closed.closed and closed.close_reason == "over"
    assert closed_state(closed, "again") is None
    assert not state.closed  # the input is never modified


def test_withdraw_of_a_running_participant_opens_the_next_round():
    state = RendezvousState(run_id="j", round=3, complete=True, participants=["a", "b", "c"],
                            waiting=["d"], nodes={n: {"name": n} for n in "abcd"})
    new = withdrawn_state(state, "b", leaving=True)
    assert new is not None
    assert (new.round, new.complete, new.cause) == (4, False, "leave")
    assert new.expected == ["a", "c", "d"] and new.participants == [] and "b" not in new.nodes


def test_withdraw_without_leaving_only_removes_the_node():
    state = RendezvousState(run_id="j", round=2, participants=["a", "b"], expected=["a", "b"])
    new = withdrawn_state(state, "b", leaving=False)
    assert new is not None and new.round == 2
    assert new.participants == ["a"] and new.expected == ["a"]


def test_withdraw_of_an_absent_node_or_from_a_closed_rendezvous_writes_nothing():
    assert withdrawn_state(RendezvousState(run_id="j", participants=["a"]), "b", True) is None
    closed = RendezvousState(run_id="j", participants=["b"], closed=True)
    assert withdrawn_state(closed, "b", leaving=True) is None


def test_the_first_round_last_call_defaults_to_torchs_and_is_configurable():
    from harness.rendezvous import RendezvousParameters
    from harness.rendezvous._c10d import C10dSettings

    params = RendezvousParameters(backend="c10d", endpoint="h:1", run_id="r", min_nodes=1,
                                  max_nodes=2)
    assert C10dSettings.from_params(params).last_call_timeout == 30.0
    params = RendezvousParameters(backend="c10d", endpoint="h:1", run_id="r", min_nodes=1,
                                  max_nodes=2, last_call_timeout="0.5")
    assert C10dSettings.from_params(params).last_call_timeout == 0.5


def test_a_node_record_read_before_is_taken_as_validated_only_while_it_is_the_same():
    """A parse keeps each node's record as read and as validated: the next state that has
    the same record reuses it, a changed one is validated again, and every parse hands out
    records of its own (a caller that changes one changes no other state)."""
    from harness.rendezvous import RendezvousStateError

    def state(port):
        return RendezvousState(run_id="j", participants=["a"],
                               nodes={"a": {"name": "a", "addr": "x", "live": "x:1", "port": port}})

    first = RendezvousState.from_json(state(29500).to_json(), "j", "here")
    first.nodes["a"]["name"] = "changed by a caller"
    second = RendezvousState.from_json(state(29500).to_json(), "j", "here")
    assert second.nodes["a"] == {"name": "a", "addr": "x", "live": "x:1", "port": 29500}
    raw = state(29500).to_json().replace(b'"port":29500', b'"port":70000')
    with pytest.raises(RendezvousStateError, match="port 70000"):
        RendezvousState.from_json(raw, "j", "here")
