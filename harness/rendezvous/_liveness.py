"""Liveness decisions of the c10d rendezvous, free of I/O: peers' keep-alive expiry, this
node's own contact with the store (fencing), and why a running round is over.

The keeper thread of ``C10dRendezvousHandler`` does the I/O (heartbeats, reads) and
feeds what it saw to these objects; they decide on an injected clock, so the rules are
unit-tested with a fake one (``tests/unit/test_liveness.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from harness.rendezvous._state import RendezvousState

__all__ = ["MONOTONIC", "Clock", "KeepAliveLease", "PeerWatch", "PeerVerdict", "StoreContact", "change_reason",
           "lease_text", "leaving_members", "parse_fences", "parse_lease"]


class Clock(Protocol):
    """What these decisions need of a clock: ``harness.timer.FakeClock`` in tests."""

    def now(self) -> float: ...


class _Monotonic:
    """``time.monotonic`` as a ``Clock`` (the timer package's clock would cost every agent
    ~80 ms of imports for one method)."""

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "MONOTONIC"


MONOTONIC: Clock = _Monotonic()


@dataclass(frozen=True)
class PeerVerdict:
    dead: frozenset[str]  # heartbeat still for heartbeat_timeout, or its lease expired
    suspects: frozenset[str]  # heartbeat late (> 2.5 intervals) but not dead yet
    #: heartbeat moved since the observation before (proof of life now, not a reset)
    advanced: frozenset[str] = frozenset()


class KeepAliveLease:
    """How long this node may go without an answer from the store before it fences itself:
    its lease, grown from the gaps its own keep-alive has shown.

    Why not a fixed bound: a node's heartbeat reaches its peers only as often as its
    keep-alive thread runs and the store answers. On a quiet host that is every
    ``keep_alive_interval``; on a loaded one the gaps stretch, and a fixed 0.8 s turns a
    slow node into a dead one. A process that *died* needs no timeout at all (its liveness
    socket closes: its peers know within milliseconds); only silence does, and silence
    should be judged against what this node has shown. So the lease is ``margin`` times the
    largest recent gap between two of its heartbeats (that peak decays with ``half_life``
    seconds), never below ``base`` (the configured bound) nor above ``cap``. The node
    publishes it beside its heartbeat (``StoreKeys.lease``); its peers declare it dead only
    after ``lease + keep_alive_interval`` of silence on their clocks, so it has always
    fenced itself first (``StoreContact``), whichever way the lease moved.
    """

    def __init__(self, clock: Clock, base: float, cap: float, margin: float = 3.0,
                 half_life: float = 10.0):
        self._clock = clock
        self.base = base
        self.cap = max(base, cap)
        self.margin = margin
        self.half_life = half_life
        self._last = clock.now()
        self._peak = 0.0
        self._peak_at = self._last
        self._store_silent = False

    def unanswered(self) -> None:
        """A request of this node went unanswered: the silence up to the next answer is the
        store's (a partition, a frozen store), not this node's scheduling, and must not
        grow its lease (a first partition used to raise it to 3.9 s, so a second took 4 s
        to detect instead of 0.8 s: the main job's ``flapping_link``)."""
        self._store_silent = True

    def beat(self) -> None:
        """This node's heartbeat was just answered."""
        now = self._clock.now()
        gap = now - self._last
        self._last = now
        if self._store_silent:
            self._store_silent = False  # the gap spans the store's silence: not learnt
            return
        if gap >= self._decayed(now):
            self._peak, self._peak_at = gap, now

    def _decayed(self, now: float) -> float:
        return float(self._peak * 0.5 ** ((now - self._peak_at) / self.half_life))

    @property
    def seconds(self) -> float:
        """The lease now."""
        return min(self.cap, max(self.base, self.margin * self._decayed(self._clock.now())))


def lease_text(seconds: float, fences: int) -> str:
    """What a node publishes under its lease key: the lease in seconds, then how many
    times it has fenced, once it has. The count is written the moment the store answers
    again, before the node's next heartbeat: a peer whose workers failed because this
    node's stopped reads it and learns of the fence even when it hears this node's
    heartbeat before this node's rejoin (``Keeper.peers_fenced``)."""
    return f"{seconds:.3f}" if fences == 0 else f"{seconds:.3f} {fences}"


def _fields(raw: bytes) -> list[str]:
    try:
        return raw.decode("ascii").split() if raw else []
    except UnicodeDecodeError:
        return []


def parse_lease(raw: bytes) -> float | None:
    """A peer's published lease (ASCII seconds, ``lease_text``); None for a missing or
    garbled value (the peer is then judged by the configured bound)."""
    fields = _fields(raw)
    try:
        value = float(fields[0]) if fields else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < 1e6 else None


def parse_fences(raw: bytes) -> int:
    """How many times a peer has fenced, by its lease key (``lease_text``); 0 for a
    missing or garbled count (a fence then shows as its rejoin, later)."""
    fields = _fields(raw)
    if len(fields) != 2 or not fields[1].isdigit():
        return 0
    return int(fields[1])


class PeerWatch:
    """Keep-alive expiry of peers, judged on *our* clock only.

    Each peer bumps a counter every ``interval``; a peer whose counter did not move for
    its bound — ``timeout``, or its published lease plus one interval when that is longer
    (``KeepAliveLease``) — of our observation time is dead. No node ever compares its clock
    with another's. If our own observer was starved (a long gap between two of its
    observations: the host was overloaded, or we could not reach the store), every
    peer's clock restarts instead of blaming them all for our own absence.
    """

    def __init__(self, clock: Clock, interval: float, timeout: float):
        self._clock = clock
        self.interval = interval
        self.timeout = timeout
        self._seen: dict[str, tuple[bytes, float]] = {}
        self._previous = clock.now()
        self.longest = timeout  # the longest bound of the last observation (the verdict's wait)

    @property
    def starvation_gap(self) -> float:
        return max(3 * self.interval, self.timeout / 2)

    def bound(self, lease: float | None) -> float:
        """How long a peer that published ``lease`` may stay silent."""
        return self.timeout if lease is None else max(self.timeout, lease + self.interval)

    def unmoved(self, counters: Iterable[tuple[str, bytes]]) -> list[str]:
        """The peers whose heartbeat has not moved since the last observation (or that
        were never observed, or whose key is gone): the ones whose silence ``observe`` may
        judge now, so the ones whose published lease must be read fresh first."""
        return [node for node, value in counters
                if value == b"" or self._seen.get(node, (None, 0.0))[0] in (None, value)]

    def observe(self, counters: Iterable[tuple[str, bytes]],
                leases: Mapping[str, float | None] | None = None) -> PeerVerdict:
        """``counters``: (peer, its heartbeat value now; ``b""`` = its key is gone);
        ``leases``: what each peer published (``parse_lease``), if anything."""
        now = self._clock.now()
        starved = now - self._previous > self.starvation_gap
        self._previous = now
        dead, suspects, advanced = set(), set(), set()
        timeout, seen = self.timeout, self._seen
        leases = leases or {}
        longest = timeout
        suspect_after = 2.5 * self.interval
        for node, value in counters:  # inline: 127 peers a beat at 128 nodes
            old = seen.get(node)
            if old is None or old[0] != value or starved:
                if old is not None and old[0] != value and value != b"":
                    advanced.add(node)
                seen[node] = old = (value, now)
            bound = self.bound(leases.get(node))
            if bound > longest:
                longest = bound
            age = now - old[1]
            if age > bound or value == b"":
                dead.add(node)
            elif age > suspect_after:
                suspects.add(node)
        self.longest = longest
        return PeerVerdict(frozenset(dead), frozenset(suspects), frozenset(advanced))


class StoreContact:
    """Has this node reached the store lately? The fencing decision.

    ``ok()`` after every answered store request, ``failed()`` after one that got no
    answer in time, ``lapsed()`` whenever this node looks again after not running (its
    keep-alive thread woke up, or an answer came in). A node that has had no answer for
    ``bound`` seconds (the handler uses one keep-alive interval less than the silence
    after which its peers declare it dead) is *fenced*: its peers are about to re-form
    the world without it, so its workers must stop and none may start until the store
    answers again.

    The bound is a lease: it runs out whether the store did not answer or this node did
    not ask. A node whose thread was not scheduled for longer than the bound (an
    overloaded host) has been silent to its peers just as long, and they may already
    have re-formed without it; so it fences itself the moment it runs again, before it
    does anything else (such a node's workers would otherwise train on in the old
    round while the new one started).
    """

    def __init__(self, clock: Clock, bound: float):
        self._clock = clock
        self._lock = threading.Lock()  # the keeper thread and the agent both look (lapsed)
        self.bound = bound
        self.last_ok = clock.now()
        self.fenced_at: float | None = None
        self.fences = 0  # how many times this node was fenced (a generation counter)

    @property
    def fenced(self) -> bool:
        return self.fenced_at is not None

    def silent_for(self) -> float:
        return self._clock.now() - self.last_ok

    def request_timeout(self, cap: float, floor: float = 0.05) -> float:
        """How long the next request may wait for its answer: at most ``cap``, and no
        later than the moment the silence reaches the bound (so the fence is decided on
        time, not a whole request timeout late), but never less than ``floor``."""
        if self.fenced_at is not None:
            return cap
        return max(floor, min(cap, self.bound - self.silent_for()))

    def ok(self) -> bool:
        """The store answered; True if that ends a fence."""
        with self._lock:
            self.last_ok = self._clock.now()
            if self.fenced_at is None:
                return False
            self.fenced_at = None
            return True

    def failed(self) -> bool:
        """A request went unanswered; True if this begins a fence."""
        with self._lock:
            if self.fenced_at is not None or self.silent_for() < self.bound:
                return False
            self.fenced_at = self._clock.now()
            self.fences += 1
            return True

    def lapsed(self) -> bool:
        """This node looks again (before its next request, or at an answer that came
        late); True if its lease ran out meanwhile: that begins a fence, as an
        unanswered request would."""
        return self.failed()


def leaving_members(state: RendezvousState, members: list[str]) -> list[str]:
    """The ``members`` that announced their leave in ``state``."""
    return [n for n in members if state.leaving(n) is not None]


def change_reason(*, state: RendezvousState | None, running_round: int | None,
                  running_members: list[str], dead: set[str] | frozenset[str],
                  live_waiting: list[str], max_nodes: int, store_lost: str | None = None,
                  fenced: str | None = None, for_barrier: bool = False,
                  leaving: list[str] | None = None) -> str | None:
    """Why the round this node runs is over (None: it is not). ``for_barrier``: only
    reasons that make a wait inside the round pointless (a newcomer waiting to join
    does not: the round may still finish). ``leaving``: the running members that
    announced their leave in ``state``, where the caller keeps them (``leaving_members``);
    else found here."""
    if store_lost is not None:
        return store_lost
    if fenced is not None:
        return fenced
    if state is None or running_round is None:
        return None
    if state.closed:
        if state.closed_by_a_finished_node() and not for_barrier:
            # That node's exit barrier timed out before the slower nodes were done: as
            # under torch, the running round goes on to its end here, whoever leaves now.
            # Re-forming could only die on RendezvousClosedError and lose their results.
            return None
        return f"the rendezvous was closed ({state.close_reason or 'job over'})"
    if state.round != running_round:
        return f"round {state.round} began ({state.cause})"
    lost = [n for n in running_members if n in dead]
    if lost:
        return "lost " + ", ".join(state.name(n) for n in lost)
    if for_barrier:
        return None
    if leaving is None:
        leaving = leaving_members(state, running_members)
    if leaving:  # its workers are being stopped: ours' collectives with them will break
        return ", ".join(state.name(n) for n in leaving) + " is leaving"
    if len(running_members) < max_nodes and live_waiting:
        return f"{len(live_waiting)} node(s) waiting to join"
    return None
