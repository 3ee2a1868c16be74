"""The keeper: one thread per dynamic-rendezvous handler that keeps this node alive in the
store and watches its peers (heartbeats, liveness sockets, fencing, the latest state).

One of the three parts of the dynamic rendezvous (``_c10d`` wires them; ``_store_host``
reaches the store). Every ``keep_alive_interval`` it bumps this node's heartbeat counter,
reads the state and the peers' counters, judges them (``_liveness.PeerWatch``) and
connects to each peer's liveness socket, whose EOF reveals a dead process within
milliseconds (``_live_sockets``: a thread of its own waits on them, so that news does not
wait for the next look). What it saw is kept under one lock for the handler's questions
(``change_reason``, ``wait_for_verdict``, ``live_waiting``, ...), and news of a change to
the round this node runs is written to a self-pipe (``event_fd``) so the agent wakes at
once. A store that does not answer for ``heartbeat_timeout - keep_alive_interval`` fences
this node (``_liveness.StoreContact``); one that refuses connections is lost for good.

Nothing is opened before ``start()``: the listener is bound and the thread started when
the handler is first used, not when it is constructed.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.rendezvous._api import RendezvousConnectionError, RendezvousError, RendezvousStateError
from harness.rendezvous._live_sockets import LiveSockets
from harness.rendezvous._liveness import (
    Clock,
    KeepAliveLease,
    PeerVerdict,
    PeerWatch,
    StoreContact,
    change_reason,
    lease_text,
    leaving_members,
    parse_fences,
    parse_lease,
)
from harness.rendezvous._state import RendezvousState, StoreKeys
from harness.rendezvous._store import StoreConnectionError, StoreTimeoutError
from harness.rendezvous._store_host import NoAnswer, StoreHost
from harness.selfpipe import close_pipe, drain_pipe, self_pipe, wake_pipe
from harness.thread_cpu import ThreadCpu, cpu_span

__all__ = ["Keeper", "KeeperSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeeperSettings:
    """The keeper's share of ``C10dSettings``."""

    keep_alive_interval: float
    heartbeat_timeout: float
    join_timeout: float
    max_lease: float = 0.0  # the longest silence a lease may grow to (0: heartbeat_timeout)
    settle_time: float = 0.0  # how long a look waits after news, so a burst of changes is read once


class Keeper:
    """This node's heartbeat and its view of the peers; see the module docstring."""

    def __init__(self, store: StoreHost, keys: StoreKeys, node: str, name: str,
                 settings: KeeperSettings, max_nodes: int, clock: Clock):
        self._store = store
        self._keys = keys
        self._node = node
        self._name = name
        self._settings = settings
        self._max_nodes = max_nodes
        self._clock = clock

        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._snapshot: RendezvousState | None = None
        self._dead: set[str] = set()
        self._suspects: set[str] = set()
        self.snapshot_read_at = float("-inf")  # when the keep-alive behind the snapshot began
        self._store_lost: str | None = None
        self._state_error: RendezvousStateError | None = None
        self._fence_reason: str | None = None
        #: the keeper thread's CPU clock (set when it starts), and its mark at the last
        #: answer: a fence says where the silence since went (a CPU it waited for, or sleep)
        self._cpu: ThreadCpu | None = None
        self._answered_mark: tuple[float, float, float] | None = None
        # a fence stays visible until the agent has read it once (fence_reason), even if
        # the store answers first: a lapsed lease must stop the workers all the same
        self._fence_seen = False
        self._fence_over = False
        self._live = LiveSockets(self._peer_died, name)
        self._running_round: int | None = None
        self._running_members: list[str] = []
        self._running_peers: frozenset[str] = frozenset()  # the same, less this node: asked each tick
        #: (state, members, the members leaving in it): ``_leaving_locked``'s last answer
        self._leavers: tuple[RendezvousState | None, list[str], list[str]] | None = None
        #: the state's bytes as last read, and what they parsed to (the keeper thread's own)
        self._parsed: tuple[bytes, RendezvousState] | None = None
        #: the keys this keeper has read a value of: they exist from then on (nothing
        #: deletes the state, a heartbeat or a lease), so a read of them skips the wait
        self._present: set[str] = set()
        self._last_watched: list[str] = []  # the peers the last look watched (the next keep-alive reads them)
        self._beat_keys: tuple[list[str], list[str]] | None = None  # those peers, the keys a keep-alive reads
        self._signaled = False
        self._stopped = threading.Event()
        self._contact: StoreContact | None = None
        self._lease: KeepAliveLease | None = None  # this node's, grown from its own gaps
        self._published = 0.0  # the lease its peers last read from the store
        self._fences_published = 0  # the fences its lease key counts (``lease_text``)
        #: each peer of the running round -> the fences its record counted when it joined
        self._round_fences: dict[str, int] = {}
        self._longest = settings.heartbeat_timeout  # the longest silence a peer may have now
        #: peer -> a moment (monotonic) it was alive after: the start of the keep-alive before
        #: the one that last saw its heartbeat move (it moved after that one read it)
        self._heard: dict[str, float] = {}
        self._beat_began = -1.0  # the start of the last keep-alive
        self._heartbeat_dead: set[str] = set()  # the peers the last keep-alive found silent too long
        self._leases: dict[str, float | None] = {}  # peer -> the lease it published, when last read
        self._pipe_r = self._pipe_w = -1
        self._woken = False  # a byte was written to the pipe since the last drain
        self._listener: socket.socket | None = None
        self.live = ""  # host:port of our liveness socket, once started
        self._thread: threading.Thread | None = None
        self._client: Any = None  # the thread's store connection, cut short by ``stop``

    # -- life ---------------------------------------------------------------------------

    def start(self, addr: str, bind: str | None = None) -> None:
        """Bind the liveness socket (on ``addr``'s port, published as ``live``) and start
        the thread. The store must be open: a node that hosts it never fences. ``bind``:
        the node's own address (``--local-addr``), so the socket is not open on every
        interface. Without one, or one this machine does not have, it binds them all."""
        s = self._settings
        # A node fences one keep-alive interval before its peers can declare it dead
        # (they need more than heartbeat_timeout of silence since they *saw* its last
        # beat), so its workers are stopping before a smaller world can form. The agent
        # hosting the store is never cut off from it: it never fences.
        base = s.heartbeat_timeout - s.keep_alive_interval
        self._contact = StoreContact(self._clock, float("inf") if self._store.hosting else base)
        self._lease = KeepAliveLease(self._clock, base, max(s.max_lease, s.heartbeat_timeout)
                                     - s.keep_alive_interval)
        self._published = base
        self._pipe_r, self._pipe_w = self_pipe()
        listener = self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind((bind or "0.0.0.0", 0))
        except OSError:  # a name or an address that is not this machine's (behind a NAT)
            listener.bind(("0.0.0.0", 0))
        listener.listen(1024)
        self.live = f"{addr}:{listener.getsockname()[1]}"

    def publish_lease(self, client: Any) -> None:
        """Write this node's lease before it joins (its peers read it with its heartbeat)."""
        self._write_lease(client, self._published, self._fences_published)

    def run(self) -> None:
        """Start the keep-alive thread (after ``start()`` and the state's creation)."""
        self._thread = threading.Thread(target=self._keep, name=f"rdzv-keeper:{self._name}",
                                        daemon=True)
        self._thread.start()

    def stop_watching(self) -> None:
        """Stop watching the peers' liveness sockets (the job is over here): when a job
        ends, every node closes its sockets at once, and each would hear its peers' close
        one by one."""
        self._live.close()

    def stop(self) -> None:
        """Stop the thread, close every socket and the pipe; idempotent. The thread's wait
        on the store (up to a keep-alive interval: 0.8 s at 128 nodes) is cut short, so a
        node's shutdown does not wait it out."""
        self._stopped.set()
        interrupt = getattr(self._client, "interrupt", None)
        if interrupt is not None:
            interrupt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * self._settings.keep_alive_interval + 1)
        self._live.close()
        if self._listener is not None:
            self._listener.close()
        close_pipe(self._pipe_r, self._pipe_w)
        self._pipe_r = self._pipe_w = -1

    # -- what the handler asks ----------------------------------------------------------

    def event_fd(self) -> int | None:
        return self._pipe_r if self._pipe_r >= 0 else None

    def drain(self) -> None:
        """Empty the event pipe. The agent asks at every monitor tick, and a read of an
        empty pipe is a system call and an exception: it reads only after a ``signal``
        (which writes its byte before it sets ``_woken``, so a byte is never left
        unread for long: at worst the next tick reads it)."""
        if self._woken:
            self._woken = False
            drain_pipe(self._pipe_r)

    @property
    def fences(self) -> int:
        """How many times this node was fenced (the handler renews its connection after one)."""
        return self._contact.fences if self._contact is not None else 0

    def signal(self) -> None:
        with self._lock:
            self._wakeup.notify_all()
        wake_pipe(self._pipe_w)
        self._woken = True

    def raise_if_broken(self) -> None:
        if self._store_lost is not None:
            raise RendezvousConnectionError(self._store_lost)
        if self._state_error is not None:
            raise self._state_error

    @property
    def store_lost(self) -> str | None:
        return self._store_lost

    def watch(self, state: RendezvousState) -> None:
        """This node runs round ``state.round``: report changes to it from now on."""
        with self._lock:
            self._running_round = state.round
            self._running_members = list(state.participants)
            self._running_peers = frozenset(state.participants) - {self._node}
            self._round_fences = {n: state.fences(n) for n in self._running_peers}
            self._snapshot = state
            self._signaled = False
        self.drain()

    def unwatch(self) -> None:
        """This node left its round (it is rendezvousing again)."""
        with self._lock:
            self._running_round = None
            self._running_members = []
            self._running_peers = frozenset()
            self._round_fences = {}
            self._signaled = False
        self.drain()

    @property
    def running_round(self) -> int | None:
        return self._running_round

    def snapshot(self) -> RendezvousState | None:
        """The state as the last keep-alive read it (None before the first)."""
        with self._lock:
            return self._snapshot

    def fence_reason(self) -> str | None:
        """Why this node is fenced. A fence the store has meanwhile ended is still
        returned once, to the first caller (the agent stops its workers for it): a node
        whose lease lapsed while it was not scheduled must not train on because the
        store answered a moment later."""
        self._check_lease()  # the caller may run before the keeper thread after a stall
        with self._lock:
            reason = self._fence_reason
            if reason is not None:
                self._fence_seen = True
                if self._fence_over:
                    self._end_fence_locked()
            return reason

    def _begin_fence_locked(self, reason: str) -> None:
        self._fence_reason = reason
        self._fence_seen = self._fence_over = False
        self._wakeup.notify_all()

    def _end_fence_locked(self) -> None:
        self._fence_reason = None
        self._fence_over = False
        self._signaled = False
        self._wakeup.notify_all()

    def wait_unfenced(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until not fenced (or the store is lost for good)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._fence_reason is not None and self._store_lost is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wakeup.wait(remaining)
            return self._fence_reason is None

    def wait_for_verdict(self, confirm: bool) -> str | None:
        """Why the running round is over, None if it is not. Waits, at most
        ``heartbeat_timeout``, while a peer of the round is suspect (heartbeat late), and
        with ``confirm`` (workers failed) also for a keep-alive begun after this call, and
        until every peer of the round has been heard alive after it (its heartbeat moved):
        on a lossy link the news of a lost peer (its liveness socket's FIN, retransmitted
        after a drop) can come after the failure it caused, and a fresh read alone would
        charge that loss as a restart. A peer not heard within the bound is dead by then,
        and that is the verdict (see ``C10dRendezvousHandler.membership_changed``)."""
        asked = time.monotonic()
        slack = 2 * self._settings.keep_alive_interval if confirm else 0.0  # one beat to see the silence
        deadline = asked + self._longest + slack
        self._sock_dead_into_dead()
        with self._lock:
            while True:
                reason = self._change_reason_locked(for_barrier=False)
                members = self._running_peers
                pending = self._suspects & members
                stale = confirm and (self.snapshot_read_at < asked
                                     or any(self._heard.get(n, -1.0) < asked for n in members))
                remaining = deadline - time.monotonic()
                if reason is not None or not (pending or stale) or remaining <= 0:
                    return reason
                self._wakeup.wait(remaining)

    def peers_fenced(self, read: Callable[[list[str]], list[bytes]]) -> str | None:
        """Which peers of the running round fenced after it formed (their workers
        stopped), by the counts their lease keys carry (``read``: the values of keys, on a
        connection of the caller's); None if none did, or the keys could not be read.

        Why not wait for their rejoin: a peer fenced for a moment (packets lost, then the
        store answered again) stops its workers, ours fail, and its heartbeat moves on
        before its rejoin reaches the state; ``wait_for_verdict`` then finds every peer
        alive and nothing changed, and the failure its fence caused would be charged as a
        restart. Its count is written before its first heartbeat after the fence."""
        with self._lock:
            joined = dict(self._round_fences)
            state = self._snapshot
        if not joined:
            return None
        peers = list(joined)
        try:
            values = read([self._keys.lease(n) for n in peers])
        except (NoAnswer, RendezvousError):  # the store's errors are rendezvous errors too
            return None
        fenced = [n for n, raw in zip(peers, values, strict=False) if parse_fences(raw) > joined[n]]
        if not fenced:
            return None
        names = ", ".join(n if state is None else state.name(n) for n in fenced)
        return f"{names} fenced (cut off from the store) after the round began"

    def lost_a_member_only(self) -> bool:
        """The change is a member gone (not the store): the store can still be read."""
        with self._lock:
            return (self._store_lost is None and self._fence_reason is None
                    and not self._dead.isdisjoint(self._running_members))

    def live_waiting(self) -> list[str]:
        with self._lock:
            return self._live_waiting_locked()

    def round_abandoned(self, round_: int) -> str | None:
        """Why a wait inside ``round_`` (rank assignment, exit barrier) should give up."""
        self._sock_dead_into_dead()
        with self._lock:
            if self._running_round != round_:
                return f"round {round_} is no longer current"
            return self._change_reason_locked(for_barrier=True)

    def dead_now(self) -> set[str]:
        """The peers known dead, by heartbeat or by a closed liveness socket."""
        self._sock_dead_into_dead()
        dead = self.sock_dead()
        with self._lock:
            return set(self._dead) | dead

    # -- the thread ---------------------------------------------------------------------

    def _keep(self) -> None:
        s = self._settings
        peers = PeerWatch(self._clock, s.keep_alive_interval, s.heartbeat_timeout)
        client: Any = None
        assert self._contact is not None
        self._contact.ok()  # the handler just reached the store: the lease starts now
        self._cpu = ThreadCpu(threading.get_native_id())  # read by any thread that checks the lease
        self._answered_mark = self._cpu_mark()
        try:
            while not self._stopped.is_set():
                self._check_lease()
                if client is None:
                    client = self._client = self._connect()
                    if client is None:  # unreachable: fenced (or soon), try again
                        self._stopped.wait(s.keep_alive_interval)
                        continue
                    if self._stopped.is_set():  # stopped while it connected: no wait to cut short
                        break
                try:
                    client.set_timeout(self._op_timeout())
                    self._publish_fences(client)
                    # a keep-alive every interval; a change of the state between two only
                    # re-reads the state: a round that N nodes join changes it N times, and a
                    # keep-alive on each change read every peer's heartbeat (N^3 reads a round)
                    seq = self._beat(client, peers) if self._to_next_beat() <= 0 else self._look(client)
                    try:
                        client.wait([self._keys.seq(seq + 1)], max(self._to_next_beat(), 0.001))
                    except StoreTimeoutError:
                        if not getattr(client, "connected", True):
                            raise  # not even the cancel was answered
                    else:  # news: let a burst of changes settle (``settle_time``) before the look
                        settle = min(s.settle_time, self._to_next_beat())
                        if settle > 0:
                            self._stopped.wait(settle)
                    self._answered()  # news, or the cancel of a wait without news
                except StoreTimeoutError as e:
                    client.close()
                    client = None
                    self._no_answer(e)
                except RendezvousStateError as e:
                    with self._lock:
                        self._state_error = e
                    self.signal()
                    self._stopped.wait(s.keep_alive_interval)
        except StoreConnectionError as e:
            if not self._stopped.is_set():
                self._lose_store(e)
        except Exception as e:  # never a traceback wall from a daemon thread
            if not self._stopped.is_set():
                log.warning("rendezvous keeper stopped: %s: %s", type(e).__name__, e)
                self._lose_store(e)
        finally:
            if client is not None:
                client.close()
            cpu, self._cpu = self._cpu, None  # no other thread reads it from now on
            if cpu is not None:
                cpu.close()

    def _to_next_beat(self) -> float:
        """Seconds until the next keep-alive is due (<= 0: due now)."""
        return self._beat_began + self._settings.keep_alive_interval - time.monotonic()

    def _op_timeout(self) -> float:
        """How long the keeper waits for one answer: half the keep-alive bound (a slow
        answer is retried on a fresh connection before it counts), and never past the
        moment the fence is due."""
        assert self._contact is not None
        return self._contact.request_timeout(max(self._settings.heartbeat_timeout / 2, 0.05))

    def _connect(self) -> Any:
        """A fresh connection; None if the store does not answer (yet). Raises
        ``StoreConnectionError`` if it refused: the store is gone, not just out of reach."""
        try:
            return self._store.connect(self._op_timeout())
        except NoAnswer as e:
            self._no_answer(e.cause)
            return None

    def _beat(self, client: Any, peers: PeerWatch) -> int:
        """One keep-alive round: bump our heartbeat, read the state and the peers'
        heartbeats (and the leases of those whose heartbeat stood still), decide who is dead;
        the state's seq (the caller waits for the next)."""
        began = time.monotonic()
        state, heard = self._bump_and_read(client)
        self._answered()
        self._renew_lease(client)
        watched = self._watched(state)
        unread = [n for n in watched if n not in heard]  # peers new since the last look
        if unread:
            heard.update(zip(unread, self._read(client, [self._keys.heartbeat(n) for n in unread]), strict=False))
        beats = [(n, heard[n]) for n in watched]
        # a peer's lease matters only while its heartbeat stands still: read it then, fresh
        # (a lease a silent peer grew is read before it is judged), not each beat for all
        stalled = peers.unmoved(beats)
        if stalled:
            fresh = self._read(client, [self._keys.lease(n) for n in stalled])
            self._leases.update((n, parse_lease(v)) for n, v in zip(stalled, fresh, strict=False))
        self._answered()
        verdict = peers.observe(beats, self._leases)
        self._longest = peers.longest
        self._heartbeat_dead = set(verdict.dead)
        return self._take(state, began, watched, verdict)

    def _bump_and_read(self, client: Any) -> tuple[RendezvousState, dict[str, bytes]]:
        """Bump this node's heartbeat, then read the state and the heartbeats of the peers
        watched at the last look: in one request where the store can (``add_and_peek``,
        once every key has been read before), else one after the other. The state, and
        the heartbeats read by peer (a peer the state adds is read by the caller)."""
        guess = self._last_watched
        kept = self._beat_keys
        if kept is None or kept[0] != guess:  # the same peers from one beat to the next, most often
            kept = self._beat_keys = (guess, [self._keys.state, *(self._keys.heartbeat(n) for n in guess)])
        keys = kept[1]
        both = getattr(client, "add_and_peek", None)
        if both is not None and self._present.issuperset(keys):
            values: list[bytes] = both(self._keys.heartbeat(self._node), 1, keys)[1]
        else:
            client.add(self._keys.heartbeat(self._node), 1)
            values = self._read(client, keys)
        return self._parse_state(values[0]), dict(zip(guess, values[1:], strict=False))

    def _read_state(self, client: Any) -> RendezvousState:
        """The state document (see ``_parse_state``)."""
        return self._parse_state(self._read(client, [self._keys.state])[0])

    def _parse_state(self, raw: bytes) -> RendezvousState:
        """``raw`` parsed, only when its bytes changed. Every keep-alive reads the state,
        and between two changes it is the same bytes: at 128 nodes 13-18 KB, 170-260 us to
        parse, a quarter of a keep-alive's work. The same bytes give the same object, so
        what is cached per state (``_leaving_locked``) holds across keep-alives too."""
        kept = self._parsed
        if kept is not None and kept[0] == raw:
            return kept[1]
        state = self._keys.parse(raw)
        self._parsed = (raw, state)
        return state

    def _read(self, client: Any, keys: list[str]) -> list[bytes]:
        """The values of ``keys`` now. torch's ``multi_get`` first waits for every key, a
        round trip of its own; a key this keeper has read a value of exists, so once all
        of them have, they are peeked at, without that wait. A
        key not yet seen is waited for (a peek of a missing key closes the connection of
        torch's classic store), unless the store reads it as ``b""`` (etcd)."""
        if not keys:
            return []
        if client.peeks_missing_keys or self._present.issuperset(keys):
            values: list[bytes] = client.peek_many(keys)
        else:
            values = client.multi_get(keys)
        self._present.update(k for k, v in zip(keys, values, strict=False) if v)
        return values

    def _watched(self, state: RendezvousState) -> list[str]:
        """The peers this node watches: every node of ``state`` and of the round it runs."""
        return [n for n in dict.fromkeys(state.participants + state.expected + state.waiting
                                         + self._running_members) if n != self._node]

    def _look(self, client: Any) -> int:
        """Between two keep-alives: read the state that changed (who joined, left, waits),
        and judge the peers by their liveness sockets and the last keep-alive's verdict on
        their heartbeats; the state's seq."""
        began = time.monotonic()
        state = self._read_state(client)
        self._answered()
        return self._take(state, began, self._watched(state), None)

    def _take(self, state: RendezvousState, began: float, watched: list[str], verdict: PeerVerdict | None) -> int:
        """Make ``state`` (read at ``began``) this node's view, the peers dead by their
        heartbeats (the last keep-alive's) or their liveness sockets; with a keep-alive's
        ``verdict``, also its suspects and the peers it heard. The state's seq."""
        self._connect_live(state, watched)
        self._last_watched = watched
        dead = self._heartbeat_dead | self.sock_dead()
        with self._lock:
            self._snapshot = state
            self.snapshot_read_at = began
            self._state_error = None
            self._dead = dead & set(watched)
            if verdict is None:
                self._suspects &= set(watched)
            else:
                self._suspects = set(verdict.suspects) - dead
                self._heard.update(dict.fromkeys(verdict.advanced, self._beat_began))
                self._beat_began = began
            self._wakeup.notify_all()
        self._maybe_signal()
        return state.seq

    def _check_lease(self) -> bool:
        """Fence now if this node's lease ran out, whether a request went unanswered or the
        node was not looking (its thread was not scheduled, or an answer came too late):
        its peers may have gone on. True if this began a fence."""
        contact = self._contact
        if contact is None or self._stopped.is_set():  # not started, or stopped: nobody renews
            return False
        silent = contact.silent_for()
        if not contact.lapsed():
            return False
        span = cpu_span(self._answered_mark, self._cpu_mark())
        where = f"; of that, {span.describe('its keep-alive thread')}" if span is not None else ""
        self._fence(f"fenced: no answer from the rendezvous store at {self._keys.endpoint} "
                    f"for {silent:.1f}s, past this node's lease of {contact.bound:g}s (the store "
                    f"did not answer, or this node was not scheduled in time on an overloaded "
                    f"host; its peers go on without it after {self._peers_bound():g}s of silence)"
                    f"{where}")
        return True

    def _cpu_mark(self) -> tuple[float, float, float] | None:
        """(monotonic now, seconds run, seconds waited for a CPU) of the keeper thread."""
        times = None if self._cpu is None else self._cpu.times()
        return None if times is None else (time.monotonic(), *times)

    def _peers_bound(self) -> float:
        """The silence after which this node's peers declare it dead (``PeerWatch.bound``
        of the lease it published)."""
        s = self._settings
        return max(s.heartbeat_timeout, self._published + s.keep_alive_interval)

    def _fence(self, reason: str) -> None:
        with self._lock:
            self._begin_fence_locked(reason)
        log.info("rendezvous %s: %s", self._keys.run_id, reason)  # the agent says it louder
        self.signal()

    def _renew_lease(self, client: Any) -> None:
        """After each answered heartbeat: grow or shrink this node's lease with the gaps it
        has shown (``KeepAliveLease``). A longer one is published before this node relies
        on it (its peers must wait as long); a shorter one applies at once and is published
        once it has moved by a tenth (the peers only wait longer meanwhile)."""
        lease, contact = self._lease, self._contact
        assert lease is not None and contact is not None
        lease.beat()
        if self._store.hosting:
            return  # never fences: nothing to publish
        new = lease.seconds
        if abs(new - self._published) > 0.1 * self._published:
            self._write_lease(client, new, self._fences_published)
            self._published = new
            if new > contact.bound:
                log.info("rendezvous %s: this node's lease is now %.2fs (its keep-alive gaps grew)",
                         self._keys.run_id, new)
        contact.bound = min(new, self._published)

    def _publish_fences(self, client: Any) -> None:
        """After a fence, before anything else this node writes: its lease key with the
        new count (``peers_fenced`` says why). Idempotent, so a write whose answer was
        lost is simply made again."""
        fences = self.fences  # a node that hosts the store never fences: always 0 there
        if fences != self._fences_published:
            self._write_lease(client, self._published, fences)
            self._fences_published = fences

    def _write_lease(self, client: Any, seconds: float, fences: int) -> None:
        """This node's lease key: ``seconds``, and the fences it has had (``lease_text``)."""
        client.set(self._keys.lease(self._node), lease_text(seconds, fences))

    def _answered(self) -> None:
        assert self._contact is not None
        self._check_lease()  # an answer that came after the lease ran out ends it all the same
        silent = self._contact.silent_for()
        ended_a_fence = self._contact.ok()
        self._answered_mark = self._cpu_mark()
        if ended_a_fence:
            with self._lock:
                if self._fence_seen:
                    self._end_fence_locked()
                else:  # the agent has not stopped its workers for it yet: it reads it once
                    self._fence_over = True
            log.info("rendezvous %s: the store at %s answers again after %.1fs",
                     self._keys.run_id, self._keys.endpoint, silent)
            self.signal()

    def _no_answer(self, error: BaseException) -> None:
        """A request got no answer: fence once silent for the bound, give up (fatal)
        after ``join_timeout`` of silence."""
        contact = self._contact
        assert contact is not None
        if self._lease is not None:
            self._lease.unanswered()
        if self._check_lease():
            return
        if contact.fenced and contact.silent_for() > self._settings.join_timeout:
            raise StoreConnectionError(
                f"no answer from the rendezvous store at {self._keys.endpoint} for "
                f"{contact.silent_for():.0f}s (join_timeout={self._settings.join_timeout:g}s): "
                f"{error}")

    def _lose_store(self, error: BaseException) -> None:
        self._store_lost = self._store.lost_message(error)
        self.signal()

    # -- liveness sockets ---------------------------------------------------------------

    def _connect_live(self, state: RendezvousState, watched: list[str]) -> None:
        for node in watched:
            if not self._live.tried(node):
                target = state.nodes.get(node, {}).get("live", "")
                if target:
                    self._live.connect(node, target)

    def sock_dead(self) -> set[str]:
        """The peers whose liveness socket was closed (their process is gone)."""
        return self._live.dead()

    def _peer_died(self, node: str) -> None:
        """The liveness thread's news: ``node``'s process is gone. A member of the running
        round makes it over now (the agent is woken), not at the next look."""
        with self._lock:
            if node in self._running_peers:
                self._dead.add(node)
            self._wakeup.notify_all()
        self._maybe_signal()

    def _sock_dead_into_dead(self) -> None:
        dead = self.sock_dead()
        if dead:
            with self._lock:
                self._dead |= dead.intersection(self._running_members)

    # -- the verdict --------------------------------------------------------------------

    def _maybe_signal(self) -> None:
        """Wake the agent once for a change to the round it runs. Once it has been woken,
        nothing is computed: when a 128-node job ends, each agent hears up to 127 peers'
        liveness sockets close, and each reason named every lost peer."""
        with self._lock:
            if self._signaled:
                return
            reason = self._change_reason_locked(for_barrier=False)
            fire = self._signaled = reason is not None
        if fire:
            self.signal()

    def _change_reason_locked(self, for_barrier: bool) -> str | None:
        return change_reason(
            state=self._snapshot, running_round=self._running_round,
            running_members=self._running_members, dead=self._dead,
            live_waiting=self._live_waiting_locked(), max_nodes=self._max_nodes,
            store_lost=self._store_lost, fenced=self._fence_reason, for_barrier=for_barrier,
            leaving=self._leaving_locked())

    def _leaving_locked(self) -> list[str]:
        """The running members leaving in the last state read, found once per state: the
        agent asks for the verdict at every monitor tick, and a scan of 128 members was
        22 us of its 25 (661 ticks an agent in a 128-node job). Both the state and the
        members list are replaced, never changed in place, so identity tells a new one."""
        state, members = self._snapshot, self._running_members
        kept = self._leavers
        if kept is None or kept[0] is not state or kept[1] is not members:
            kept = self._leavers = (state, members, [] if state is None else leaving_members(state, members))
        return kept[2]

    def _live_waiting_locked(self) -> list[str]:
        state = self._snapshot
        if state is None:
            return []
        return [n for n in state.waiting if n not in self._dead and n != self._node]
