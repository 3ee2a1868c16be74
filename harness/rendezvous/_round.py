"""The c10d round state machine: what one node writes next, decided without any I/O.

``C10dRendezvousHandler.next_rendezvous`` is a loop of *read the state, decide, write it
with compare-and-set or wait for the next change*. This module is the *decide* part,
a plain object with an injected clock, so every rule can be unit-tested with a fake
clock (``tests/unit/test_round.py``) instead of processes and sleeps:

* **join** — a forming round takes a node that is not in it, and with it every node that
  asked to join it (its joining list) and is not in it yet; a complete round puts a
  newcomer on the waiting list; a participant of a complete round it has already run
  opens the next round (survivors and live waiting nodes are *expected*).
* **close** — a forming round completes as soon as ``max_nodes`` joined, or ``min_nodes``
  joined and every expected node has, or the *last call* ran out since ``min_nodes``
  were in (each node measures it on its own clock; no cross-node clock comparison).
* **last call** — the first formation of a job (round 0) waits ``last_call_timeout``
  (torch's 30 s by default) so agents started seconds apart form one world; later
  rounds know who to expect and wait ``RECOVERY_LAST_CALL`` for expected nodes that are
  alive but slow (node-loss recovery closes as soon as all are in). A round that knows
  whom to expect (every later round, and a first round told ``first_round_nodes``)
  counts its last call from the latest join this node saw, not from when ``min_nodes``
  were in: it closes once joins stop coming, not while they still do. Why: 128 agents
  several times slower than usual rejoined over more than the window, every round closed
  with a part of them, the rest went on the waiting list, and the next membership change
  restarted everyone again: the job never trained.
* **expiry** — dead participants/expected nodes are dropped from a forming round.
* **restarts** — the job's restart count (``RendezvousState.restarts``) is raised only
  by a node's own writes to a *forming* round (its join, or its opening of the next
  round), after its agent charged a failure (``charge_failure``): so every participant
  of a complete round saw the same count, and a failure seen by several nodes of the
  same round counts once (each asks for "the count I ran with, plus one").
* **leave, in two phases** — a node stopped by a signal first *announces* its leave
  (``leaving_state``: the running round's members stop their workers and call it a
  membership change, so the collectives its stopping workers break are not charged as
  failures), and *withdraws* (``withdrawn_state``: opens the next round without it) only
  once its own workers are gone. Between the two, a member of the round does not open
  the next one: its workers could meet the leaver's still-running ones (two writers of
  one checkpoint). The wait ends when the leaver withdraws, is known dead, or overstays
  the grace it announced by ``LEAVE_SLACK`` (its agent has SIGKILLed its workers by then).
* **close** — a pure state transition used by ``shutdown()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.rendezvous._liveness import Clock
from harness.rendezvous._state import Joining, RendezvousState

__all__ = [
    "LEAVE_SLACK",
    "RECOVERY_LAST_CALL",
    "RECOVERY_LAST_CALL_PER_NODE",
    "RoundRules",
    "RoundMachine",
    "Step",
    "closed_state",
    "complete_round",
    "leaving_state",
    "withdrawn_state",
]

#: how long a round after the first waits, since the latest join, for expected nodes that
#: are alive but have not joined yet (a survivor slow to stop its workers); node loss
#: itself never waits
RECOVERY_LAST_CALL = 1.0
#: ... and for each node it expects: many survivors stop their workers and rejoin one after
#: another on a loaded machine (64 nodes on 2 cores: the last came more than 1 s after the
#: first, and a round that closed without it started its workers beside its old ones)
RECOVERY_LAST_CALL_PER_NODE = 0.1

#: how long past the grace a leaving node announced the others wait for it to withdraw
#: before they count it dead (its agent SIGKILLs its workers when the grace runs out; the
#: slack covers the kill and the withdrawal's write on a loaded machine)
LEAVE_SLACK = 5.0


@dataclass(frozen=True)
class RoundRules:
    """The knobs the decisions depend on (resolved from ``C10dSettings`` and the params)."""

    min_nodes: int
    max_nodes: int
    last_call_timeout: float = 30.0
    join_timeout: float = 600.0
    poll: float = 0.2  # longest wait for news before looking again
    #: nodes a launcher started at once for the first round (0: unknown): it completes as
    #: soon as that many joined, and waits its last call only for one that never came
    first_round_nodes: int = 0

    def last_call_for(self, round_: int, expecting: int = 0) -> float:
        """Round 0 is the first formation: torch's last call. Later rounds expect a known
        set of nodes (``expecting`` of them), so the last call only bounds the wait for
        slow survivors since the latest join: ``RECOVERY_LAST_CALL``, longer by
        ``RECOVERY_LAST_CALL_PER_NODE`` for each node past ten, never past the configured
        last call."""
        if round_ == 0:
            return self.last_call_timeout
        return min(self.last_call_timeout, max(RECOVERY_LAST_CALL, RECOVERY_LAST_CALL_PER_NODE * expecting))


@dataclass(frozen=True)
class Step:
    """One decision: ``kind`` is ``finish`` (the round is ours: return it), ``write``
    (compare-and-set ``state``), ``wait`` (block up to ``wait_for`` s for a change),
    ``closed`` (the job ended) or ``timeout`` (join_timeout passed)."""

    kind: str
    state: RendezvousState | None = None
    wait_for: float = 0.0


class RoundMachine:
    """One node's path through the rounds of a job.

    Long-lived (one per handler): it remembers the round it joined and the last round it
    ran, so a participant of a round it already ran knows to open the next one. Each
    ``next_rendezvous`` call starts an attempt with ``begin()`` and then feeds every
    state it reads to ``step()``.
    """

    def __init__(self, node: str, rules: RoundRules, clock: Clock):
        self.node = node
        self.rules = rules
        self._clock = clock
        self.joined_round: int | None = None
        self.last_round: int | None = None
        self.deadline = clock.now() + rules.join_timeout
        #: (round, participants seen, since when): the last call's start in that round
        self._last_call: tuple[int, int, float] | None = None
        #: (round, node) -> when this node first saw ``node`` leaving that round
        self._leave_seen: dict[tuple[int, str], float] = {}
        #: the least restart count the next round this node joins must carry
        self.owed = 0

    def charge_failure(self, ran_with: int) -> None:
        """This node's workers failed on their own in a round whose count was
        ``ran_with``: the next round counts at least one more. Keyed by the count, not by
        the node: every node that saw the same failure asks for the same number, so it
        counts once, and a late charge for an old round never adds to a newer one."""
        self.owed = max(self.owed, ran_with + 1)

    def _joining(self, state: RendezvousState) -> RendezvousState:
        """A copy of ``state`` (a forming round) carrying what this node owes."""
        new = state.copy()
        new.restarts = max(new.restarts, self.owed)
        return new

    def asked(self, round_: int) -> None:
        """This node asked to join forming round ``round_`` (its joining list): it may find
        itself in the round without a write of its own, even first in a complete one."""
        self.joined_round = round_

    def begin(self) -> None:
        """A new ``next_rendezvous`` call: a fresh join deadline and last call."""
        self.deadline = self._clock.now() + self.rules.join_timeout
        self._last_call = None

    def finished(self, state: RendezvousState) -> None:
        """The node runs ``state``'s round now."""
        self.last_round = state.round

    def last_call_left(self, state: RendezvousState) -> float | None:
        """Seconds left of the last call of ``state``'s round as this node measures it
        (None: it has not started: fewer than ``min_nodes`` are in)."""
        if self._last_call is None or self._last_call[0] != state.round:
            return None
        return (self.rules.last_call_for(state.round, len(state.expected))
                - (self._clock.now() - self._last_call[2]))

    def step(self, state: RendezvousState, dead: set[str], meta: dict[str, Any],
             joining: Mapping[str, Joining] | None = None) -> Step:
        """Decide what to do about ``state`` (just read). ``dead``: nodes this node
        believes gone; ``meta``: what to publish about itself when it joins; ``joining``:
        the nodes that asked to join the forming round (``StoreKeys.joining``), taken in
        with this node's own join."""
        rules, me = self.rules, self.node
        if state.closed:
            return Step("closed")
        now = self._clock.now()
        if now > self.deadline:
            return Step("timeout")
        wait = Step("wait", wait_for=min(rules.poll, max(0.0, self.deadline - now)))
        if state.complete:
            if me in state.participants:
                if state.round == self.joined_round and state.round != self.last_round:
                    return Step("finish", state)
                stopping, overstayed = self._leavers(state, dead, now)
                if stopping:
                    return wait
                return Step("write", self._open_next_round(state, dead | overstayed, meta))
            if me in state.waiting:
                if all(n in dead for n in state.participants):
                    # the running round's nodes are all dead: none of them will open the
                    # next round for the waiting list, so this node does (torch marks such
                    # a round incomplete and moves on: ``_remove_participant_epilogue``).
                    # A node that joined as the last one died waited here to its join timeout
                    return Step("write", self._open_next_round(state, dead, meta))
                return wait
            new = state.copy()  # a complete round's count is fixed: the charge waits
            new.waiting.append(me)
            new.nodes[me] = dict(meta)
            return Step("write", new)
        self.joined_round = state.round
        if me not in state.participants:
            return Step("write", self._join(state, dead, meta, joining or {}))
        gone = dead & (set(state.participants) | set(state.expected))
        if gone:
            new = state.copy()
            new.participants = [n for n in new.participants if n not in gone]
            new.expected = [n for n in new.expected if n not in gone]
            return Step("write", new)
        joined = len(state.participants)
        if joined < rules.min_nodes:
            self._last_call = None
            return wait
        mark = self._last_call
        if mark is None or mark[0] != state.round:
            self._last_call = (state.round, joined, now)
        elif joined > mark[1]:  # a node joined since: a round that knows whom it expects waits on
            self._last_call = (state.round, joined, now if self._expects_known(state) else mark[2])
        all_in = bool(state.expected) and all(e in state.participants for e in state.expected)
        if state.round == 0 and not state.expected and rules.first_round_nodes:
            all_in = joined >= rules.first_round_nodes  # every node the launcher started is in
        left = self.last_call_left(state)
        assert left is not None
        if joined >= rules.max_nodes or all_in or left <= 0:
            new = state.copy()
            complete_round(new)
            return Step("write", new)
        return Step("wait", wait_for=min(wait.wait_for, left))

    def _join(self, state: RendezvousState, dead: set[str], meta: dict[str, Any],
              joining: Mapping[str, Joining]) -> RendezvousState:
        """``state`` (a forming round) with this node in it, and every live node that asked
        to join it and is not in it yet, up to ``max_nodes``, in the order they asked.

        Why all of them: a join is a compare-and-set of the whole state, and nodes that
        join at once each retry on the state the others wrote. 128 nodes joined one after
        another, one every 19 ms on two cores (three tries at the median, up to eighteen):
        the last to ask waited over a second. Taken in together, a round of 128 forms in a
        few writes, and a node that finds itself taken in writes nothing."""
        me, new = self.node, self._joining(state)
        taking = [(me, (dict(meta), self.owed))]
        taking += [(node, asked) for node, asked in joining.items()
                   if node != me and node not in state.participants and node not in dead]
        for node, (record, owed) in taking[:max(0, self.rules.max_nodes - len(new.participants))]:
            new.participants.append(node)
            new.nodes[node] = dict(record)
            new.restarts = max(new.restarts, owed)  # what it would have raised the count to itself
        taken = set(new.participants)
        new.waiting = [n for n in new.waiting if n not in taken]
        if len(new.participants) >= self.rules.max_nodes:
            complete_round(new)
        return new

    def _expects_known(self, state: RendezvousState) -> bool:
        """Whether ``state``'s round knows whom it waits for: a later round (its survivors and
        waiting nodes), or a first round the launcher said how many nodes it started for.
        Torch's first round does not: its last call runs from ``min_nodes``, however many
        join after."""
        return bool(state.expected) or (state.round == 0 and self.rules.first_round_nodes > 0)

    def _leavers(self, state: RendezvousState, dead: set[str],
                 now: float) -> tuple[bool, set[str]]:
        """Whether a member of ``state``'s running round announced its leave, has not
        withdrawn and may still have workers (not dead, not past its grace + slack); and
        the leavers that overstayed (counted dead: their agents killed their workers)."""
        overstayed: set[str] = set()
        stopping = False
        for node in state.participants:
            grace = state.leaving(node)
            if node == self.node or grace is None or node in dead:
                continue
            seen = self._leave_seen.setdefault((state.round, node), now)
            if now - seen > grace + LEAVE_SLACK:
                overstayed.add(node)
            else:
                stopping = True
        return stopping, overstayed

    def _open_next_round(self, state: RendezvousState, dead: set[str],
                         meta: dict[str, Any]) -> RendezvousState:
        survivors = [n for n in state.participants if n not in dead]
        waiting = [n for n in state.waiting if n not in dead and n not in survivors]
        new = self._joining(state)
        new.round += 1
        new.complete = False
        new.cause = ("death" if len(survivors) < len(state.participants)
                     else "join" if waiting else "restart")
        new.expected = survivors + waiting
        new.participants = [self.node]
        new.waiting = []
        new.nodes = {n: m for n, m in state.nodes.items() if n in new.expected}
        new.nodes[self.node] = dict(meta)
        self.joined_round = new.round
        return new


def complete_round(state: RendezvousState) -> None:
    """Fix the participants (in place): expected nodes first, in their old order, so
    survivors keep their ranks; newcomers after them in joining order."""
    expected, joined = state.expected, state.participants
    state.participants = sorted(joined, key=lambda n: (
        expected.index(n) if n in expected else len(expected), joined.index(n)))
    state.complete = True
    state.expected = []


def closed_state(state: RendezvousState, reason: str,
                 finished: str | None = None) -> RendezvousState | None:
    """``state`` closed for ``reason``; None if it already is. ``finished``: the closing
    node, when it closes because its workers succeeded (see ``change_reason``)."""
    if state.closed:
        return None
    new = state.copy()
    new.closed, new.close_reason = True, reason
    if finished is not None:
        new.nodes[finished] = {**new.nodes.get(finished, {}), "finished": True}
    return new


def leaving_state(state: RendezvousState, node: str, grace: float) -> RendezvousState | None:
    """``state`` with ``node`` announcing its leave (it will stop its workers within
    ``grace`` s, then withdraw); None if there is nothing to announce: the job is over, no
    round is running, ``node`` is not in it, or it already announced."""
    if state.closed or not state.complete or node not in state.participants \
            or state.leaving(node) is not None:
        return None
    new = state.copy()
    new.nodes[node] = {**new.nodes.get(node, {}), "leaving": float(grace)}
    return new


def withdrawn_state(state: RendezvousState, node: str, leaving: bool) -> RendezvousState | None:
    """``state`` without ``node``; None if it is not in it (or the job is over). A
    participant of a running round that is ``leaving`` opens the next round for the
    others at once (they need not wait for its heartbeat to expire)."""
    if state.closed or (node not in state.participants and node not in state.waiting
                        and node not in state.expected):
        return None
    new = state.copy()
    running = state.complete and node in state.participants
    new.participants = [n for n in new.participants if n != node]
    new.expected = [n for n in new.expected if n != node]
    new.waiting = [n for n in new.waiting if n != node]
    new.nodes.pop(node, None)
    if running and leaving:
        new.round += 1
        new.complete = False
        new.cause = "leave"
        new.expected = new.participants + new.waiting
        new.participants, new.waiting = [], []
    return new
