"""The agent's per-tick decision and exit-barrier decision (``harness.agent._decide``)."""

from __future__ import annotations

import pytest

from harness.agent import WorkerState
from harness.agent._decide import (
    Action,
    Decision,
    FenceClock,
    RestartCount,
    Tick,
    decide,
    exit_barrier_needed,
    needs_membership_check,
)
from harness.timer import FakeClock

S = WorkerState
FAILED_STATES = [S.FAILED, S.UNHEALTHY]


def test_healthy_and_nothing_changed_waits():
    assert decide(Tick(S.HEALTHY), remaining_restarts=3) == Decision(Action.WAIT)


def test_healthy_with_a_membership_change_reforms_without_a_restart():
    assert decide(Tick(S.HEALTHY, membership_changed=True), 0) == Decision(Action.REFORM,
                                                                            "membership")


@pytest.mark.parametrize("state", FAILED_STATES)
def test_a_failure_uses_a_restart_while_some_remain(state):
    assert decide(Tick(state), 1).action is Action.RESTART
    assert decide(Tick(state), 0).action is Action.GIVE_UP


@pytest.mark.parametrize("state", FAILED_STATES)
def test_a_failure_caused_by_a_membership_change_is_not_charged(state):
    assert decide(Tick(state, membership_changed=True), 0) == Decision(Action.REFORM, "failure")


@pytest.mark.parametrize("changed", [False, True])
@pytest.mark.parametrize("fenced", [None, "fenced: x"])
def test_success_wins_over_everything(changed, fenced):
    assert decide(Tick(S.SUCCEEDED, changed, fenced), 0).action is Action.SUCCEED


@pytest.mark.parametrize("state", [S.HEALTHY, S.FAILED, S.UNHEALTHY])
@pytest.mark.parametrize("changed", [False, True])
@pytest.mark.parametrize("restarts", [0, 2])
def test_a_fenced_node_stops_its_workers_whatever_else_it_saw(state, changed, restarts):
    decision = decide(Tick(state, changed, "fenced: no answer for 0.9s"), restarts)
    assert decision == Decision(Action.FENCE, "fenced: no answer for 0.9s")


@pytest.mark.parametrize("state", [S.INIT, S.STOPPED, S.UNKNOWN])
def test_states_the_loop_cannot_act_on(state):
    assert decide(Tick(state), 3).action is Action.INVALID
    assert decide(Tick(state, fenced="fenced"), 3).action is Action.INVALID


def test_membership_is_checked_only_where_it_matters():
    assert {s for s in S if needs_membership_check(s)} == {S.HEALTHY, S.UNHEALTHY, S.FAILED}


@pytest.mark.parametrize("has_store,size,fenced,needed", [
    (True, 2, False, True),
    (True, 1, False, False),  # alone: nobody to wait for
    (False, 4, False, False),  # no store (static single node)
    (True, 4, True, False),  # fenced: the barrier could only time out
])
def test_exit_barrier_needed(has_store, size, fenced, needed):
    assert exit_barrier_needed(has_store, size, fenced) is needed


def test_fence_clock_measures_one_fence_at_a_time():
    clock = FakeClock()
    fence = FenceClock(clock)
    assert fence.end() == 0.0
    fence.begin()
    clock.advance(2.5)
    fence.begin()  # already on: keeps the first start
    clock.advance(0.5)
    assert fence.end() == 3.0 and fence.since is None


def test_restart_count_is_the_rounds_from_the_rendezvous():
    """Our rendezvous carries the job's count: the agent runs with it whatever it charged
    itself (another node's failure counts; two charges of one failure count once)."""
    count = RestartCount(max_restarts=2)
    assert (count.current, count.remaining) == (0, 2)
    assert count.adopt(1) == 1 and count.remaining == 1 and count.job_wide  # another node failed
    count.charge()
    assert count.current == 1  # a charge shows from the next round on
    assert count.adopt(2) == 2 and count.remaining == 0
    assert decide(Tick(S.FAILED), count.remaining).action is Action.GIVE_UP


def test_restart_count_without_a_job_count_is_the_agents_own():
    """A handler that keeps no count (a foreign one): torch's rule, per agent."""
    count = RestartCount(max_restarts=1)
    count.adopt(None)
    count.charge()
    assert count.current == 0 and count.adopt(None) == 1 and not count.job_wide
    assert count.remaining == 0


def test_remaining_is_never_negative():
    count = RestartCount(max_restarts=1)
    count.adopt(3)
    assert count.remaining == 0
