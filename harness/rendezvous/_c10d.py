"""The ``c10d`` dynamic rendezvous: elastic multi-node membership on a TCPStore.

How a round forms (all state is one JSON document, ``_state.RendezvousState``, written by
``compare_set`` against the exact bytes read, so concurrent writers never lose updates):

* A node that finds the current round complete and is not in it puts itself on the
  waiting list; the running nodes see it (``num_nodes_waiting``/``membership_changed``),
  stop their workers and call ``next_rendezvous``. The first one to do so opens the next
  round, listing the survivors and the waiting nodes as *expected*.
* A forming round completes as soon as ``max_nodes`` joined, or ``min_nodes`` joined and
  every live expected node has, or the last call ran out since ``min_nodes`` were in
  (measured by each participant on its own monotonic clock: no node ever compares its
  clock with another's). The first formation waits ``last_call_timeout`` (torch's 30 s),
  so agents started seconds apart form one world; recovery from a loss or a join never
  waits for a last call. The decisions live in ``_round.RoundMachine`` (no I/O).
* Waits are event-driven: every write sets ``seq/<n>``, and waiters block in a store
  ``wait`` on the next one (bounded slices), never in a fixed sleep.

Liveness, two layers:
* each node bumps ``hb/<node>`` every ``keep_alive_interval`` (default 0.1 s); a peer whose
  counter did not move for ``heartbeat_timeout`` (default 0.8 s) of *our* observation time
  is dead (a hung, stopped or partitioned node). If our own observer thread was starved
  (a long gap between its rounds) it restarts every peer's clock instead of blaming them.
* each node also listens on a "liveness" socket and connects to each peer's: a process
  that dies (SIGKILL included) has its sockets closed by the kernel, so survivors learn
  of it within milliseconds, before their gloo collectives fail. ``membership_changed``
  checks these sockets synchronously, so a worker failure caused by a dead peer is
  recognised as a membership change (no restart used up).

Fencing: a node whose keeper has had no answer from the store for one keep-alive
interval less than ``heartbeat_timeout`` (the silence after which its peers declare it
dead) is *fenced* (``fence_reason()``): its
peers are re-forming the world without it, so the agent stops its workers and starts
none until the store answers again; then it rejoins as a new member. A store that
*refuses* or *closes* connections is gone (fatal, as below); one that does not answer
is unreachable (fenced, retried). The decisions live in ``_liveness`` (no I/O).

Restarts are counted for the job, in the state (``restarts``): the agent calls
``charge_restart()`` when its workers failed on their own, and the next round this node
joins carries at least the count it ran with plus one (``_round.RoundMachine``). Every
node of a round reads the same count (``RendezvousInfo.restart_count``), a node that
joins later reads it too, and nodes that saw the same failure count it once.

Graceful leave, two phases: an agent stopped by a signal calls ``announce_leave(grace)``
before it stops its workers (the round's other members stop theirs and call the broken
collectives a membership change, not a failure of their own), and the launcher calls
``leave()`` once they are gone: that drops the node and opens the next round. The round
is not re-formed in between (``_round``: two rounds' workers never overlap). ``shutdown()`` otherwise
closes the rendezvous: the job is over (success or restarts exhausted) and every other
agent gets ``RendezvousClosedError`` at its next rendezvous.

Three parts, one job each: ``_store_host.StoreHost`` reaches the store (and hosts it in
this agent when elected), ``_keeper.Keeper`` is the thread behind the liveness and fencing
above, and the handler here wires them to the round machine (``_round.RoundMachine``)
and does the round's reads and writes. Constructing a handler opens nothing: the store is
opened, the liveness socket bound and the keeper started on first use (``next_rendezvous``,
``is_closed``, ``set_closed``).

The store: by default the agent whose address matches the endpoint host hosts it (``is_host``
overrides), in-process, as our pure-Python TCPStore server (``_store.StoreServer``: no torch
import, wire-compatible with torch). That agent is the job's single point of failure, as
in torch: if it dies, the others fail fast with a ``RendezvousConnectionError`` naming the
lost store. To survive the loss of any node, run the store outside the nodes
(``python -m harness.rendezvous.store_server --port N``) and give the agents
``--rdzv-conf is_host=false``. With a job secret in the environment
(``HARNESS_RDZV_SECRET``/``_FILE``, read once in ``_store_host()``), every connection to
the store proves it and strangers are refused (``_store_auth``).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.endpoints import PortReservation, fqdn, split_endpoint
from harness.errors import ConfigError
from harness.rendezvous._agent_store import AgentStore, agent_store_enabled
from harness.rendezvous._api import (
    HEARTBEAT_TIMEOUT,
    KEEP_ALIVE_INTERVAL,
    MAX_LEASE_FACTOR,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from harness.rendezvous._keeper import Keeper, KeeperSettings
from harness.rendezvous._liveness import MONOTONIC, Clock
from harness.rendezvous._round import (
    RoundMachine,
    RoundRules,
    closed_state,
    leaving_state,
    withdrawn_state,
)
from harness.rendezvous._round_store import RoundStore
from harness.rendezvous._state import RendezvousState, StoreKeys, joining_line, parse_joining
from harness.rendezvous._store import (
    DEFAULT_PORT,
    StoreConnectionError,
    StoreTimeoutError,
)
from harness.rendezvous._store_auth import job_secret
from harness.rendezvous._store_host import StoreHost, is_local_host

__all__ = ["C10dRendezvousHandler", "C10dSettings", "DEFAULT_PORT", "is_local_host"]

log = logging.getLogger(__name__)

_local_ids = itertools.count()


@dataclass(frozen=True)
class C10dSettings:
    """``--rdzv-conf`` knobs of the c10d backend, resolved once."""

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = KEEP_ALIVE_INTERVAL
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    read_timeout: float = 60.0
    is_host: bool | None = None
    #: the longest a node's lease may grow to on a loaded host (``_liveness.KeepAliveLease``);
    #: by default ``MAX_LEASE_FACTOR`` times ``heartbeat_timeout``
    max_lease: float = 0.0
    #: how many nodes the launcher started at once (0: unknown): the first round closes as
    #: soon as they are all in (``_round.RoundRules.first_round_nodes``)
    first_round_nodes: int = 0
    #: how long a node lets the state settle after a change before it reads it again (0:
    #: at once): a round that N nodes join changes N times, and each of its waiters (and
    #: each keeper) read the whole state, which grows with N, on every change: N^3 bytes a
    #: round. Settling lets a burst of joins be read once (the harness sets it past 16 nodes)
    settle_time: float = 0.0

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> C10dSettings:
        def positive(key: str, default: float) -> float:
            value = params.get_as_float(key, default)
            if value is None or not value > 0:
                raise ConfigError(key, params.get(key), "must be a number > 0", "--rdzv-conf")
            return value

        interval = positive("keep_alive_interval", cls.keep_alive_interval)
        default_hb = cls.heartbeat_timeout
        attempts = params.get("keep_alive_max_attempt")
        if attempts is not None and params.get("heartbeat_timeout") is None:
            count = params.get_as_int("keep_alive_max_attempt")
            if count is None or count < 1:
                raise ConfigError("keep_alive_max_attempt", attempts, "must be an int >= 1",
                                  "--rdzv-conf")
            default_hb = interval * count
        heartbeat = positive("heartbeat_timeout", default_hb)
        if heartbeat <= interval:
            raise ConfigError("heartbeat_timeout", heartbeat,
                              f"must be > keep_alive_interval={interval:g}", "--rdzv-conf")
        max_lease = positive("max_lease", MAX_LEASE_FACTOR * heartbeat)
        if max_lease < heartbeat:
            raise ConfigError("max_lease", max_lease, f"must be >= heartbeat_timeout={heartbeat:g}",
                              "--rdzv-conf")
        first_round_nodes = params.get_as_int("first_round_nodes", 0)
        if first_round_nodes is None or first_round_nodes < 0:
            raise ConfigError("first_round_nodes", params.get("first_round_nodes"), "must be an int >= 0",
                              "--rdzv-conf")
        settle = params.get_as_float("settle_time", 0.0)
        if settle is None or not 0 <= settle <= 1.0:
            raise ConfigError("settle_time", params.get("settle_time"), "must be a number of seconds in 0..1",
                              "--rdzv-conf")
        return cls(
            join_timeout=positive("join_timeout", cls.join_timeout),
            last_call_timeout=positive("last_call_timeout", cls.last_call_timeout),
            close_timeout=positive("close_timeout", cls.close_timeout),
            keep_alive_interval=interval,
            heartbeat_timeout=heartbeat,
            read_timeout=positive("read_timeout", cls.read_timeout),
            is_host=params.get_as_bool("is_host", None),
            max_lease=max_lease,
            first_round_nodes=first_round_nodes,
            settle_time=settle,
        )


class C10dRendezvousHandler(RendezvousHandler):
    """Dynamic (elastic) rendezvous on a TCPStore; see the module docstring."""

    def __init__(self, params: RendezvousParameters, settings: C10dSettings | None = None,
                 backend_name: str = "c10d", default_port: int = DEFAULT_PORT, *,
                 clock: Clock = MONOTONIC):
        self._params = params
        self._settings = s = settings or C10dSettings.from_params(params)
        self._backend_name = backend_name
        self._run_id = params.run_id
        try:
            host, port = split_endpoint(params.endpoint, default_port)
        except ValueError as e:
            raise ConfigError("rdzv_endpoint", params.endpoint, str(e), "--rdzv-endpoint") from None
        if port == 0:
            raise ConfigError("rdzv_endpoint", params.endpoint,
                              "may use port 0 only for a single-node job (--nnodes=1): other "
                              "nodes could not know the port", "--rdzv-endpoint")
        self._endpoint = f"{host}:{port}"
        self._keys = StoreKeys(self._run_id, self._endpoint)
        self._addr = params.local_addr or fqdn()
        local_id = next(_local_ids)
        self._node = f"{self._addr}_{os.getpid()}_{local_id}"
        self._name = f"{socket.gethostname()}:{os.getpid()}" + (f"#{local_id}" if local_id else "")

        self._store = self._store_host(host, port)
        self._machine = RoundMachine(self._node, RoundRules(
            min_nodes=params.min_nodes, max_nodes=params.max_nodes,
            last_call_timeout=s.last_call_timeout, join_timeout=s.join_timeout,
            poll=2 * s.keep_alive_interval, first_round_nodes=s.first_round_nodes), clock)
        self._keeper = Keeper(self._store, self._keys, self._node, self._name, KeeperSettings(
            keep_alive_interval=s.keep_alive_interval, heartbeat_timeout=s.heartbeat_timeout,
            join_timeout=s.join_timeout, max_lease=s.max_lease, settle_time=s.settle_time), params.max_nodes, clock)
        self._started: bool | None = None  # None: not yet; False: the start failed
        self._client_fences = 0  # fences the main connection has been renewed after
        self._running_restarts = 0  # the job's restart count in the round this node runs
        self._reservation: PortReservation | None = None
        # rank 0's agent hosts the workers' store, fresh per round (as _solo; torch's opt-out honoured)
        self._agent_store = AgentStore() if agent_store_enabled() else None
        self._left = False
        self._finished = False

    def _store_host(self, host: str, port: int) -> StoreHost:
        """How this handler reaches its store (the etcd backend brings its own). The job
        secret is read from the environment here, once (``_store_auth.job_secret``)."""
        s = self._settings
        return StoreHost(host, port, read_timeout=s.read_timeout, is_host=s.is_host,
                         secret=job_secret(os.environ))

    def listen_for_refusals(self, listener: Callable[[str, str], None]) -> None:
        """Tell ``listener(peer, reason)`` of every connection that the store hosted here
        refuses for not proving the job secret. It is called on the store's thread. The
        agent puts these on its event stream as ``store_refused``."""
        self._store.on_refused = listener

    def _start(self) -> None:
        """First use: open the store (hosting it here if elected), bind the liveness socket,
        join the heartbeats, create the state if this node is first, start the keeper."""
        if self._started:
            return
        if self._started is False:
            raise RendezvousConnectionError(f"rendezvous {self._run_id!r} at {self._endpoint} "
                                            f"could not be opened (see the first error)")
        self._started = False
        try:
            self._store.open()
            self._keeper.start(self._addr, bind=self._params.local_addr)
            self._client.add(self._keys.heartbeat(self._node), 1)
            self._keeper.publish_lease(self._client)
            self._create_state()
        except BaseException:
            self._close_resources()
            raise
        self._keeper.run()
        self._started = True

    @property
    def _client(self) -> Any:
        return self._store.client

    # -- reads and writes of the state --------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self._name, "addr": self._addr, "live": self._keeper.live}
        if self._keeper.fences:
            meta["fences"] = self._keeper.fences
        if self._reservation is not None:
            meta["port"] = self._reservation.port
        return meta

    def _create_state(self) -> None:
        initial = RendezvousState(run_id=self._run_id).to_json()
        current = self._client.compare_set(self._keys.state, b"", initial)
        if current != initial:
            self._keys.parse(current)  # raises on foreign or corrupt state
        else:
            self._client.set(self._keys.seq(0), b"1")

    def _read(self, known: bytes | None = None) -> tuple[bytes, RendezvousState]:
        """The state as it is now: ``known`` when the caller has it (a compare-and-set's
        answer, ``_cas``), else read. It exists from ``_start`` on (``_create_state``), so
        it is read without torch's wait for the key, one round trip instead of two."""
        raw = known if known is not None else self._client.peek_many([self._keys.state])[0]
        return raw, self._keys.parse(raw)

    def _cas(self, raw: bytes, old: RendezvousState, new: RendezvousState) -> tuple[bool, bytes | None]:
        """Write ``new`` over ``raw`` (read as ``old``): whether it landed, and the state as
        the store holds it after the call (None: unknown, read it). torch's compare-and-set
        answers with the value after it: ``new`` where it landed, the state another node
        wrote where it did not. The next step starts from that answer without reading it
        again: at 128 nodes a join takes three tries at the median and up to eighteen, each
        on a state of 11 KB."""
        new.seq = old.seq + 1
        body = new.to_json()
        after = self._client.compare_set(self._keys.state, raw, body)
        if after != body:
            # the state another node wrote; an answer equal to what we expected (etcd's
            # store answers so for a missing key) says nothing: read it
            return False, None if after == raw or not after else after
        self._client.set(self._keys.seq(new.seq), b"1")
        return True, body

    def _wait_change(self, seq: int, timeout: float) -> None:
        """Block up to ``timeout`` s for the state after ``seq``; when it came, let it settle
        (``settle_time``, within the same bound) so that a burst of changes is read once."""
        began = time.monotonic()
        try:
            self._client.wait([self._keys.seq(seq + 1)], max(timeout, 0.001))
        except StoreTimeoutError:
            if not getattr(self._client, "connected", True):
                raise  # not even the cancel was answered: the store is silent
            return
        settle = min(self._settings.settle_time, timeout - (time.monotonic() - began))
        if settle > 0:
            time.sleep(settle)

    # -- the handler API ----------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend_name

    def get_run_id(self) -> str:
        return self._run_id

    def event_fd(self) -> int | None:
        return self._keeper.event_fd()

    def membership_changed(self, confirm: bool = False) -> bool:
        """Cheap when nothing changed: reads what the keeper thread saw, plus a
        non-blocking look at the peers' liveness sockets. If a peer of the running round
        looks suspicious (heartbeat late) it waits, at most ``heartbeat_timeout``, for the
        verdict, so a failure caused by a lost peer is not charged as a restart.

        ``confirm`` (the agent saw workers fail): what the keeper saw last may be a
        keep-alive old, or older when packets are lost — a peer that learnt of a joining
        node first may already have stopped the workers ours were talking to. Then it
        also waits, at most ``heartbeat_timeout``, for a keep-alive that read the store
        after this call began: the change that caused the failure is in the store by
        then, so it is found and not charged as a restart; and a peer that fenced for a
        moment (its workers stopped, its heartbeat moved on before its rejoin) is found by
        the count its lease key carries (``Keeper.peers_fenced``)."""
        self._keeper.drain()
        if self._keeper.running_round is None:
            return False
        reason = self._keeper.wait_for_verdict(confirm)
        if reason is not None and self._keeper.lost_a_member_only() and self._closed_by_a_finished_node():
            return False
        if reason is None and confirm:
            reason = self._keeper.peers_fenced(self._peek_apart)
        if reason is not None:
            log.info("rendezvous %s: membership changed: %s", self._run_id, reason)
        return reason is not None

    def _peek_apart(self, keys: list[str]) -> list[bytes]:
        """``keys``' values on a connection of their own, within ``heartbeat_timeout``: the
        agent's loop waits on the read, and the main connection must stay in step whatever
        happens to it (a read that timed out there would leave it to fail the next request)."""
        client = self._store.connect(self._settings.heartbeat_timeout)
        try:
            values: list[bytes] = client.peek_many(keys)
            return values
        finally:
            client.close()

    def _closed_by_a_finished_node(self) -> bool:
        """Whether the store says a node whose workers succeeded closed the rendezvous:
        then the running round goes on here (see ``change_reason``). Read afresh, because
        that node's liveness socket closes right after it closed the rendezvous, sooner
        than the keeper's next read could show it."""
        known = self._keeper.snapshot()
        if known is not None and known.closed:
            return known.closed_by_a_finished_node()
        try:
            _, state = self._read()
        except (RendezvousError, StoreConnectionError, StoreTimeoutError):
            return False
        return state.closed_by_a_finished_node()

    def num_nodes_waiting(self) -> int:
        return len(self._keeper.live_waiting())

    def is_closed(self) -> bool:
        self._start()
        state = self._keeper.snapshot()
        if state is None:
            try:
                _, state = self._read()
            except RendezvousError:
                return False
        return state.closed

    def set_closed(self, reason: str = "") -> None:
        self._start()
        reason = reason or f"closed by {self._name}"
        finished = self._node if self._finished else None
        self._transition(lambda state: closed_state(state, reason, finished), self._settings.close_timeout)

    def _transition(self, change: Callable[[RendezvousState], RendezvousState | None], within: float) -> None:
        """Write ``change(state)`` over the state read, compare-and-set, until it lands, there
        is nothing to write (``change`` gave None), or ``within`` seconds have passed."""
        deadline = time.monotonic() + within
        if not getattr(self._client, "connected", True):
            # an exchange cut short dropped it (the SIGTERM that brought us here raised in
            # the middle of a rendezvous wait): a fresh one, so a leave still lands
            self._store.renew(connect_within=within)
        known = None
        while time.monotonic() < deadline:
            raw, state = self._read(known)
            new = change(state)
            if new is None:
                return
            landed, known = self._cas(raw, state, new)
            if landed:
                return

    def charge_restart(self) -> None:
        """The workers of the round this node runs failed on their own: the next round
        counts one more restart for the job (once, however many nodes report it)."""
        self._machine.charge_failure(self._running_restarts)

    def mark_finished(self) -> None:
        """This node's workers succeeded: when it closes the rendezvous (on shutdown), the
        nodes still running their workers let them run to the end instead of re-forming."""
        self._finished = True

    def round_abandoned(self, round_: int) -> str | None:
        """Why a wait inside ``round_`` (rank assignment, exit barrier) should give up."""
        return self._keeper.round_abandoned(round_)

    # -- next_rendezvous ----------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        self._start()
        self._keeper.raise_if_broken()
        self._keeper.unwatch()
        self._release_port()
        self._reservation = PortReservation()
        machine = self._machine
        machine.begin()
        self._await_store(machine.deadline)
        known = None  # the state as the last compare-and-set's answer gave it
        asked: tuple[int, bytes] | None = None  # the round this call asked to join, and its line
        while True:
            self._keeper.raise_if_broken()
            try:
                raw, state = self._read(known)
                known = None
                meta, joining = self._meta(), None
                if not (state.closed or state.complete or self._node in state.participants):
                    asked = self._ask_to_join(state.round, meta, asked)
                    joining = parse_joining(self._client.peek_many([self._keys.joining(state.round)])[0])
                step = machine.step(state, self._keeper.dead_now(), meta, joining)
                if step.kind == "write":
                    assert step.state is not None
                    _, known = self._cas(raw, state, step.state)
                elif step.kind == "wait":
                    self._wait_change(state.seq, step.wait_for)
            except StoreTimeoutError as e:  # no answer: wait out a fence, reconnect, re-read
                log.info("rendezvous %s: %s; retrying", self._run_id, e)
                self._await_store(machine.deadline, renew=True)
                continue
            if step.kind == "finish":
                return self._finish(state)
            if step.kind in ("write", "wait"):
                continue
            if step.kind == "closed":
                raise RendezvousClosedError(
                    f"rendezvous {self._run_id!r} is closed: {state.close_reason or 'the job is over'}"
                    f"{'' if machine.last_round is not None else '; this node came too late to join it'}")
            else:
                self._withdraw()
                raise RendezvousTimeoutError(
                    f"rendezvous {self._run_id!r} at {self._endpoint} did not complete within "
                    f"join_timeout={self._settings.join_timeout:g}s: {len(state.participants)} "
                    f"node(s) joined, --nnodes needs {self._params.min_nodes}")

    # -- fencing ------------------------------------------------------------------------

    def _ask_to_join(self, round_: int, meta: dict[str, Any], asked: tuple[int, bytes] | None) -> tuple[int, bytes]:
        """Put this node on forming round ``round_``'s joining list (once, and again if
        what it would publish changed since ``asked``): whoever writes the state next takes
        it in (``RoundMachine.step``). The key exists once this node appended to it, so it
        is read without a wait."""
        line = joining_line(self._node, meta, self._machine.owed)
        if asked != (round_, line):
            self._client.append(self._keys.joining(round_), line)
            self._machine.asked(round_)
        return round_, line

    def fence_reason(self) -> str | None:
        """Why this node is fenced (cut off from the store for the keep-alive bound: its
        workers must stop, none may start), or None when it is not."""
        return self._keeper.fence_reason()

    def wait_unfenced(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until this node is no longer fenced (or the store is
        lost for good: then the next call raises); True when it is not fenced."""
        return self._keeper.wait_unfenced(timeout)

    def _await_store(self, deadline: float, renew: bool = False) -> None:
        """Wait out a fence (nothing can be decided without the store), then renew the
        main connection if it may have gone stale meanwhile (or ``renew``: a request on
        it went unanswered, so the stream is out of step)."""
        while self.fence_reason() is not None:
            self._keeper.raise_if_broken()
            if time.monotonic() > deadline:
                raise RendezvousConnectionError(self.fence_reason() or "fenced")
            self.wait_unfenced(min(1.0, max(0.0, deadline - time.monotonic())))
        self._keeper.raise_if_broken()
        if renew or self._keeper.fences != self._client_fences:
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"rendezvous {self._run_id!r}: the store at {self._endpoint} did not "
                    f"answer within join_timeout={self._settings.join_timeout:g}s")
            self._client_fences = self._keeper.fences
            self._store.renew()

    def _finish(self, state: RendezvousState) -> RendezvousInfo:
        rank = state.participants.index(self._node)
        master = state.nodes.get(state.participants[0], {})
        if "port" not in master:
            raise RendezvousStateError(
                f"rendezvous {self._run_id!r} round {state.round}: rank 0 "
                f"({state.name(state.participants[0])}) published no master port")
        if rank != 0 or self._agent_store is not None:
            self._release_port()
        if rank == 0 and self._agent_store is not None:
            self._agent_store.host(int(master["port"]))  # the port our reservation held
        self._machine.finished(state)
        self._running_restarts = state.restarts
        self._keeper.watch(state)
        log.info("rendezvous %s round %d complete: rank %d of %d (%s), job restarts %d",
                 self._run_id, state.round, rank, len(state.participants), state.cause,
                 state.restarts)
        store = RoundStore(self._client, self._keys.round(state.round), self, state.round,
                           self._settings.keep_alive_interval)
        return RendezvousInfo(
            store=store, rank=rank, world_size=len(state.participants),
            bootstrap_store_info=RendezvousStoreInfo(str(master.get("addr") or self._addr),
                                                     int(master["port"]),
                                                     use_agent_store=self._agent_store is not None),
            round=state.round, restart_count=state.restarts,
        )

    # -- leaving and the end ------------------------------------------------------------

    def _withdraw(self, leaving: bool = False) -> None:
        """Remove this node from the state; a leaving participant of a running round
        opens the next round for the others at once."""
        self._transition(lambda state: withdrawn_state(state, self._node, leaving),
                         min(self._settings.close_timeout, 5.0))

    def announce_leave(self, grace: float) -> None:
        """Phase one of a graceful leave: this node is about to stop its workers (within
        ``grace`` s) and will then ``leave()``. The others stop theirs now rather than
        charge the collectives ours break as a failure, and wait for the withdrawal (or
        our death, or ``grace`` + ``LEAVE_SLACK``) before they form the next round. Quick
        and best-effort: stopping the workers must not wait on the store."""
        if self._left or not self._started or self.fence_reason() is not None:
            return
        try:
            self._transition(lambda state: leaving_state(state, self._node, grace),
                             min(self._settings.close_timeout, 2.0))
        except (RendezvousError, StoreConnectionError, StoreTimeoutError) as e:
            log.warning("could not announce the leave from rendezvous %s: %s", self._run_id, e)

    def leave(self) -> None:
        """This node is going away (stopped by a signal; its workers are gone): drop it
        now so the others re-rendezvous without waiting for its heartbeat to expire."""
        if self._left:
            return
        self._left = True
        if not self._started:  # never joined (or could not open the store): nothing to withdraw
            return
        if self.fence_reason() is not None:  # the others already count this node out
            log.info("leaving rendezvous %s while fenced: nothing to withdraw", self._run_id)
            return
        try:
            self._withdraw(leaving=True)
        except RendezvousError as e:
            log.warning("could not leave rendezvous %s cleanly: %s", self._run_id, e)

    def shutdown(self) -> bool:
        """Close the rendezvous (the job is over: every other agent gets
        ``RendezvousClosedError``) and release everything. A handler whose store could
        not be opened closes nothing; one never used opens it to close it, as torch's."""
        clean = True
        self._keeper.stop_watching()
        if self._started is False:
            clean = False  # the store could not be opened: nothing to close there
        elif not self._left and self._keeper.store_lost is None and self.fence_reason() is not None:
            clean = False  # cannot reach the store to close it; the others count us out
        elif not self._left and self._keeper.store_lost is None:
            try:
                self.set_closed(f"the job ended on {self._name}")
            except RendezvousError as e:
                log.info("could not close rendezvous %s: %s", self._run_id, e)
                clean = False
        self._close_resources()
        return clean

    def _release_port(self) -> None:
        if self._agent_store is not None:
            self._agent_store.stop()
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None

    def _close_resources(self) -> None:
        self._keeper.stop()
        self._release_port()
        self._store.close()

    def __repr__(self) -> str:
        return (f"C10dRendezvousHandler(run_id={self._run_id!r}, endpoint={self._endpoint!r}, "
                f"node={self._name!r}, round={self._keeper.running_round}, "
                f"host={'yes' if self._store.hosting else 'no'})")
