"""The agent's decisions, free of processes and sockets.

``SimpleElasticAgent``'s control loop wakes (a worker exited, membership news, the
monitor interval), looks at its workers and its rendezvous, and must choose one thing.
``decide`` is that choice, a pure function of what was seen; ``FenceClock`` times a
fence on an injected clock; ``exit_barrier_needed`` says whether the end-of-job barrier
can help. ``tests/unit/test_agent_decide.py`` covers every combination without a process.

Precedence, and why:
1. workers **succeeded** — done, whatever else happened (their results are final);
2. **fenced** (cut off from the rendezvous store for the keep-alive bound) — the others
   re-form without this node, so its workers must stop now and none may start until the
   store answers; no restart is charged: nothing failed here;
3. **membership changed** (a peer died or left, a node waits to join, a new round began)
   — re-rendezvous without charging a restart, even if workers failed meanwhile: the
   failure is the consequence of the change (a collective with a dead peer fails);
4. workers **failed/unhealthy** — restart if restarts remain, else give up;
5. **healthy** — keep waiting.

Restarts are the job's, not this agent's: ``RestartCount`` takes each round's count from
the rendezvous, so every node of a round decides on the same budget (torch's agents each
count their own failures and diverge: pytorch#108158, #147064).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from harness.states import WorkerState

__all__ = ["Action", "Decision", "FenceClock", "RestartCount", "Tick", "decide",
           "exit_barrier_needed", "is_failure", "needs_membership_check"]


class Action(enum.Enum):
    WAIT = "wait"  # healthy: wait for the next change
    SUCCEED = "succeed"  # workers done: exit barrier, return the result
    FENCE = "fence"  # stop workers, start none until the store answers, then rejoin
    REFORM = "reform"  # re-rendezvous with the new membership; no restart used
    RESTART = "restart"  # workers failed: use one restart
    GIVE_UP = "give_up"  # workers failed, no restarts left
    INVALID = "invalid"  # a worker state the loop cannot act on


@dataclass(frozen=True)
class Tick:
    """What the loop saw on one wake-up."""

    state: WorkerState
    membership_changed: bool = False
    fenced: str | None = None  # the handler's fence reason


@dataclass(frozen=True)
class Decision:
    action: Action
    cause: str = ""  # REFORM: "failure" | "membership"; FENCE: the reason


_FAILED = (WorkerState.UNHEALTHY, WorkerState.FAILED)


def is_failure(state: WorkerState) -> bool:
    """Workers failed or are unhealthy: the membership check must then rest on news newer
    than the failure (a peer that saw a change first may have caused it)."""
    return state in _FAILED


def needs_membership_check(state: WorkerState) -> bool:
    """Whether ``decide`` looks at ``Tick.membership_changed`` for this worker state (the
    check may block up to the heartbeat timeout for a verdict on a late peer)."""
    return state in _FAILED or state == WorkerState.HEALTHY


def decide(tick: Tick, remaining_restarts: int) -> Decision:
    """One control-loop decision (see the module docstring for the precedence)."""
    state = tick.state
    if state == WorkerState.SUCCEEDED:
        return Decision(Action.SUCCEED)
    if tick.fenced is not None and (state in _FAILED or state == WorkerState.HEALTHY):
        return Decision(Action.FENCE, tick.fenced)
    if state in _FAILED:
        if tick.membership_changed:
            return Decision(Action.REFORM, "failure")
        if remaining_restarts > 0:
            return Decision(Action.RESTART)
        return Decision(Action.GIVE_UP)
    if state == WorkerState.HEALTHY:
        if tick.membership_changed:
            return Decision(Action.REFORM, "membership")
        return Decision(Action.WAIT)
    return Decision(Action.INVALID)


class RestartCount:
    """The restart count this agent runs with (``TORCHELASTIC_RESTART_COUNT``) and the
    budget left of ``max_restarts``.

    With our rendezvous the count is the job's: each round's comes from the rendezvous
    (``RendezvousInfo.restart_count``), the same on every node of the round, and a failure
    is charged there (``charge_restart``), so it shows from the next round on, counted
    once however many nodes saw it; a node that rejoins (or a fresh agent) reads it and
    cannot reset it. A handler that keeps no count (None: a foreign one) leaves the agent
    to count the failures it charged itself, as torch does.
    """

    def __init__(self, max_restarts: int):
        self.max_restarts = max_restarts
        self.current = 0  # the count of the round this agent runs
        self.charged = 0  # failures this agent charged (its own count, torch's rule)
        self.job_wide = False  # the last round's count came from the rendezvous

    @property
    def remaining(self) -> int:
        return max(0, self.max_restarts - self.current)

    def charge(self) -> None:
        """This agent restarts its failed workers: one restart used."""
        self.charged += 1

    def adopt(self, job_count: int | None) -> int:
        """A round began: its count is the job's (without one, this agent's own)."""
        self.job_wide = job_count is not None
        self.current = self.charged if job_count is None else job_count
        return self.current


def exit_barrier_needed(has_store: bool, group_world_size: int, fenced: bool) -> bool:
    """The exit barrier keeps a node's store alive until every node is done; it needs a
    store, more than one node, and a store this node can reach (a fenced node would only
    sit out the barrier's timeout)."""
    return has_store and group_world_size > 1 and not fenced


class _Clock(Protocol):
    def now(self) -> float: ...


class FenceClock:
    """When this node's fence began, and for how long it has lasted (for the events)."""

    def __init__(self, clock: _Clock):
        self._clock = clock
        self.since: float | None = None

    def begin(self) -> None:
        if self.since is None:
            self.since = self._clock.now()

    def end(self) -> float:
        """The fence is over: how long it lasted (0 if none was on)."""
        if self.since is None:
            return 0.0
        lasted, self.since = self._clock.now() - self.since, None
        return lasted
