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

Graceful leave: ``leave()`` (the launcher calls it when the agent is stopped by a signal)
drops the node from the state and opens the next round at once. ``shutdown()`` otherwise
closes the rendezvous: the job is over (success or restarts exhausted) and every other
agent gets ``RendezvousClosedError`` at its next rendezvous.

The store: by default the agent whose address matches the endpoint host hosts it (``is_host``
overrides), in-process, as our pure-Python TCPStore server (``_store.StoreServer``: no torch
import, wire-compatible with torch). That agent is the job's single point of failure, as
in torch: if it dies, the others fail fast with a ``RendezvousConnectionError`` naming the
lost store. To survive the loss of any node, run the store outside the nodes
(``python -m harness.rendezvous.store_server --port N``) and give the agents
``--rdzv-conf is_host=false``.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from harness.endpoints import PortReservation, fqdn, split_endpoint
from harness.errors import ConfigError
from harness.rendezvous._agent_store import AgentStore, agent_store_enabled
from harness.rendezvous._api import (
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
from harness.rendezvous._liveness import (
    MONOTONIC,
    Clock,
    PeerWatch,
    StoreContact,
    change_reason,
)
from harness.rendezvous._round import (
    RoundMachine,
    RoundRules,
    closed_state,
    withdrawn_state,
)
from harness.rendezvous._round_store import RoundStore
from harness.rendezvous._state import RendezvousState
from harness.rendezvous._store import (
    DEFAULT_PORT,
    StoreClient,
    StoreConnectionError,
    StoreServer,
    StoreTimeoutError,
)
from harness.rendezvous._store_host import elect_store_host, is_local_host
from harness.selfpipe import drain_pipe, self_pipe, wake_pipe

__all__ = ["C10dRendezvousHandler", "C10dSettings", "DEFAULT_PORT", "is_local_host"]

log = logging.getLogger(__name__)

_local_ids = itertools.count()


@dataclass(frozen=True)
class C10dSettings:
    """``--rdzv-conf`` knobs of the c10d backend, resolved once."""

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 0.1
    heartbeat_timeout: float = 0.8
    read_timeout: float = 60.0
    is_host: bool | None = None

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
        return cls(
            join_timeout=positive("join_timeout", cls.join_timeout),
            last_call_timeout=positive("last_call_timeout", cls.last_call_timeout),
            close_timeout=positive("close_timeout", cls.close_timeout),
            keep_alive_interval=interval,
            heartbeat_timeout=heartbeat,
            read_timeout=positive("read_timeout", cls.read_timeout),
            is_host=params.get_as_bool("is_host", None),
        )


class C10dRendezvousHandler(RendezvousHandler):
    """Dynamic (elastic) rendezvous on a TCPStore; see the module docstring."""

    def __init__(self, params: RendezvousParameters, settings: C10dSettings | None = None,
                 backend_name: str = "c10d", default_port: int = DEFAULT_PORT, *,
                 clock: Clock = MONOTONIC):
        self._params = params
        self._clock = clock
        self._settings = settings or C10dSettings.from_params(params)
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
        self._prefix = f"harness/rdzv/{self._run_id}/"
        self._state_key = self._prefix + "state"
        self._addr = params.local_addr or fqdn()
        local_id = next(_local_ids)
        self._node = f"{self._addr}_{os.getpid()}_{local_id}"
        self._name = f"{socket.gethostname()}:{os.getpid()}" + (f"#{local_id}" if local_id else "")
        self._hb_key = self._hb(self._node)

        self._server: StoreServer | None = None
        self._client = self._open_store(host, port)
        s = self._settings
        self._machine = RoundMachine(self._node, RoundRules(
            min_nodes=params.min_nodes, max_nodes=params.max_nodes,
            last_call_timeout=s.last_call_timeout, join_timeout=s.join_timeout,
            poll=2 * s.keep_alive_interval), clock)
        # A node fences one keep-alive interval before its peers can declare it dead
        # (they need more than heartbeat_timeout of silence since they *saw* its last
        # beat), so its workers are stopping before a smaller world can form. The agent
        # hosting the store is never cut off from it: it never fences.
        self._contact = StoreContact(clock, float("inf") if self._server is not None
                                     else s.heartbeat_timeout - s.keep_alive_interval)
        self._client_fences = 0  # fences the main connection has been renewed after
        self._fence_reason: str | None = None

        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._snapshot: RendezvousState | None = None
        self._dead: set[str] = set()
        self._suspects: set[str] = set()
        self._snapshot_read_at = float("-inf")  # when the keeper began the read behind it
        self._store_lost: str | None = None
        self._state_error: RendezvousStateError | None = None
        self._live_socks: dict[str, socket.socket] = {}
        self._live_tried: set[str] = set()
        self._running_round: int | None = None
        self._running_members: list[str] = []
        self._running_restarts = 0  # the job's restart count in the round this node runs
        self._reservation: PortReservation | None = None
        # rank 0's agent hosts the workers' store, fresh per round (as _solo; torch's opt-out honoured)
        self._agent_store = AgentStore() if agent_store_enabled() else None
        self._closed_seen = False
        self._left = False
        self._finished = False
        self._stopped = threading.Event()
        self._signaled = False
        self._pipe_r, self._pipe_w = self_pipe()

        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("0.0.0.0", 0))
        self._listener.listen(1024)
        self._live = f"{self._addr}:{self._listener.getsockname()[1]}"

        try:
            self._client.add(self._hb_key, 1)
            self._create_state()
        except BaseException:
            self._close_resources()
            raise
        self._keeper = threading.Thread(target=self._keep, name=f"rdzv-keeper:{self._name}",
                                        daemon=True)
        self._keeper.start()

    # -- store hosting ------------------------------------------------------------------

    def _open_store(self, host: str, port: int) -> StoreClient:
        s = self._settings
        is_host = s.is_host if s.is_host is not None else is_local_host(host)
        if is_host:
            self._server = elect_store_host(host, port)
            if self._server is not None:
                log.info("hosting the rendezvous store on port %d", port)
            elif s.is_host:
                log.info("is_host=true but port %d is taken; joining as a client", port)
        try:
            return StoreClient(host, port, timeout=s.read_timeout, connect_timeout=s.read_timeout)
        except BaseException:
            if self._server is not None:
                self._server.stop()
            raise

    # -- small helpers ------------------------------------------------------------------

    def _hb(self, node: str) -> str:
        return f"{self._prefix}hb/{node}"

    def _seq_key(self, seq: int) -> str:
        return f"{self._prefix}seq/{seq}"

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self._name, "addr": self._addr, "live": self._live}
        if self._reservation is not None:
            meta["port"] = self._reservation.port
        return meta

    def _parse(self, raw: bytes) -> RendezvousState:
        return RendezvousState.from_json(raw, self._run_id,
                                         f"key {self._state_key!r} of store {self._endpoint}")

    def _create_state(self) -> None:
        initial = RendezvousState(run_id=self._run_id).to_json()
        current = self._client.compare_set(self._state_key, b"", initial)
        if current != initial:
            self._parse(current)  # raises on foreign or corrupt state
        else:
            self._client.set(self._seq_key(0), b"1")

    def _read(self, client: StoreClient | None = None) -> tuple[bytes, RendezvousState]:
        raw = (client or self._client).get(self._state_key)
        return raw, self._parse(raw)

    def _cas(self, raw: bytes, old: RendezvousState, new: RendezvousState) -> bool:
        new.seq = old.seq + 1
        body = new.to_json()
        if self._client.compare_set(self._state_key, raw, body) != body:
            return False
        self._client.set(self._seq_key(new.seq), b"1")
        return True

    def _wait_change(self, seq: int, timeout: float) -> None:
        try:
            self._client.wait([self._seq_key(seq + 1)], max(timeout, 0.001))
        except StoreTimeoutError:
            if not getattr(self._client, "connected", True):
                raise  # not even the cancel was answered: the store is silent

    def _signal(self) -> None:
        with self._lock:
            self._wakeup.notify_all()
        wake_pipe(self._pipe_w)

    def _raise_if_broken(self) -> None:
        if self._store_lost is not None:
            raise RendezvousConnectionError(self._store_lost)
        if self._state_error is not None:
            raise self._state_error

    # -- the keeper thread: heartbeats, liveness, news ----------------------------------

    def _keep(self) -> None:
        s = self._settings
        peers = PeerWatch(self._clock, s.keep_alive_interval, s.heartbeat_timeout)
        client: Any = None
        try:
            while not self._stopped.is_set():
                if client is None:
                    client = self._keeper_client()
                    if client is None:  # unreachable: fenced (or soon), try again
                        self._stopped.wait(s.keep_alive_interval)
                        continue
                try:
                    client.set_timeout(self._op_timeout())
                    seq = self._beat(client, peers)
                    try:
                        client.wait([self._seq_key(seq + 1)], s.keep_alive_interval)
                    except StoreTimeoutError:
                        if not getattr(client, "connected", True):
                            raise  # not even the cancel was answered
                    self._answered()  # news, or the cancel of a wait without news
                except StoreTimeoutError as e:
                    client.close()
                    client = None
                    self._no_answer(e)
                except RendezvousStateError as e:
                    with self._lock:
                        self._state_error = e
                    self._signal()
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

    def _op_timeout(self) -> float:
        """How long the keeper waits for one answer: half the keep-alive bound (a slow
        answer is retried on a fresh connection before it counts), and never past the
        moment the fence is due."""
        return self._contact.request_timeout(max(self._settings.heartbeat_timeout / 2, 0.05))

    def _keeper_client(self) -> Any:
        """A fresh connection for the keeper; None if the store does not answer (yet).
        Raises ``StoreConnectionError`` if nothing listens there any more (refused):
        the store is gone, not just out of reach."""
        timeout = self._op_timeout()
        if isinstance(self._client, StoreClient):
            host, port = self._client.host, self._client.port
            try:
                socket.create_connection((host, port), timeout=timeout).close()
            except ConnectionRefusedError as e:
                raise StoreConnectionError(f"the rendezvous store at {self._endpoint} refused "
                                           f"the connection: {e.strerror}") from None
            except OSError as e:
                self._no_answer(e)
                return None
            try:
                client: Any = StoreClient(host, port, timeout=timeout, connect_timeout=timeout)
            except (StoreTimeoutError, StoreConnectionError) as e:
                self._no_answer(e)
                return None
            return client
        try:
            client = self._client.clone()  # another store (etcd): its own connect logic
        except (StoreTimeoutError, StoreConnectionError) as e:
            self._no_answer(e)
            return None
        client.set_timeout(timeout)
        return client

    def _beat(self, client: Any, peers: PeerWatch) -> int:
        """One keep-alive round: bump our heartbeat, read the state and the peers'
        heartbeats, decide who is dead; the state's seq (the caller waits for the next)."""
        began = time.monotonic()
        client.add(self._hb_key, 1)
        self._answered()
        raw, state = self._read(client)
        watched = [n for n in dict.fromkeys(
            state.participants + state.expected + state.waiting
            + self._running_members) if n != self._node]
        peek = getattr(client, "peek_many", client.multi_get)  # etcd: no wait
        values = peek([self._hb(n) for n in watched]) if watched else []
        self._answered()
        verdict = peers.observe(zip(watched, values, strict=False))
        self._connect_live(state, watched)
        dead = set(verdict.dead) | self._sock_dead()
        with self._lock:
            self._snapshot = state
            self._snapshot_read_at = began
            self._state_error = None
            self._dead = dead & set(watched)
            self._suspects = set(verdict.suspects) - dead
            self._wakeup.notify_all()
        self._maybe_signal()
        return state.seq

    def _answered(self) -> None:
        silent = self._contact.silent_for()
        if self._contact.ok():
            with self._lock:
                self._fence_reason = None
                self._signaled = False
                self._wakeup.notify_all()
            log.info("rendezvous %s: the store at %s answers again after %.1fs",
                     self._run_id, self._endpoint, silent)
            self._signal()

    def _no_answer(self, error: BaseException) -> None:
        """A request got no answer: fence once silent for the bound, give up (fatal)
        after ``join_timeout`` of silence."""
        contact = self._contact
        if contact.failed():
            reason = (f"fenced: no answer from the rendezvous store at {self._endpoint} for "
                      f"{contact.silent_for():.1f}s (its peers go on without this node "
                      f"after heartbeat_timeout={self._settings.heartbeat_timeout:g}s)")
            with self._lock:
                self._fence_reason = reason
                self._wakeup.notify_all()
            log.info("rendezvous %s: %s", self._run_id, reason)  # the agent says it louder
            self._signal()
        elif contact.fenced and contact.silent_for() > self._settings.join_timeout:
            raise StoreConnectionError(
                f"no answer from the rendezvous store at {self._endpoint} for "
                f"{contact.silent_for():.0f}s (join_timeout={self._settings.join_timeout:g}s): "
                f"{error}")

    def _lose_store(self, error: BaseException) -> None:
        self._store_lost = self._store_lost_message(error)
        self._signal()

    def _store_lost_message(self, error: BaseException) -> str:
        hosted = "this agent" if self._server is not None else "the node hosting it"
        return (
            f"lost the rendezvous store at {self._endpoint} ({error}); {hosted} is gone, so "
            f"the job cannot continue. To survive the loss of any node, run the store outside "
            f"the nodes (python -m harness.rendezvous.store_server --port N) and start the "
            f"agents with --rdzv-conf is_host=false")

    def _connect_live(self, state: RendezvousState, watched: list[str]) -> None:
        for node in watched:
            if node in self._live_tried:
                continue
            target = state.nodes.get(node, {}).get("live", "")
            if not target:
                continue
            self._live_tried.add(node)
            try:
                host, port = split_endpoint(target, 0)
                sock = socket.create_connection((host, port), timeout=0.3)
                sock.setblocking(False)
            except (OSError, ValueError):
                continue
            with self._lock:
                self._live_socks[node] = sock

    def _sock_dead(self) -> set[str]:
        with self._lock:
            items = list(self._live_socks.items())
        if not items:
            return set()
        try:
            readable, _, _ = select.select([s for _, s in items], [], [], 0)
        except (OSError, ValueError):
            return set()
        dead = set()
        for node, sock in items:
            if sock in readable:
                try:
                    data = sock.recv(1, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    dead.add(node)
        return dead

    def _maybe_signal(self) -> None:
        with self._lock:
            reason = self._change_reason_locked(for_barrier=False)
            fire = reason is not None and not self._signaled
            if fire:
                self._signaled = True
        if fire:
            self._signal()

    def _change_reason_locked(self, for_barrier: bool) -> str | None:
        return change_reason(
            state=self._snapshot, running_round=self._running_round,
            running_members=self._running_members, dead=self._dead,
            live_waiting=self._live_waiting_locked(), max_nodes=self._params.max_nodes,
            store_lost=self._store_lost, fenced=self._fence_reason, for_barrier=for_barrier)

    def _live_waiting_locked(self) -> list[str]:
        state = self._snapshot
        if state is None:
            return []
        return [n for n in state.waiting if n not in self._dead and n != self._node]

    # -- the handler API ----------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend_name

    def get_run_id(self) -> str:
        return self._run_id

    def event_fd(self) -> int | None:
        return self._pipe_r

    def _drain(self) -> None:
        drain_pipe(self._pipe_r)

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
        then, so it is found and not charged as a restart."""
        self._drain()
        if self._running_round is None:
            return False
        asked = time.monotonic()
        sock_dead = self._sock_dead()
        deadline = asked + self._settings.heartbeat_timeout
        with self._lock:
            self._dead |= sock_dead & set(self._running_members)
            while True:
                reason = self._change_reason_locked(for_barrier=False)
                pending = self._suspects & set(self._running_members)
                stale = confirm and self._snapshot_read_at < asked
                remaining = deadline - time.monotonic()
                if reason is not None or not (pending or stale) or remaining <= 0:
                    break
                self._wakeup.wait(remaining)
        if reason is not None and self._lost_a_member_only() and self._closed_by_a_finished_node():
            return False
        if reason is not None:
            log.info("rendezvous %s: membership changed: %s", self._run_id, reason)
        return reason is not None

    def _lost_a_member_only(self) -> bool:
        """The change is a member gone (not the store): the store can still be read."""
        with self._lock:
            return (self._store_lost is None and self._fence_reason is None
                    and bool(self._dead & set(self._running_members)))

    def _closed_by_a_finished_node(self) -> bool:
        """Whether the store says a node whose workers succeeded closed the rendezvous:
        then the running round goes on here (see ``change_reason``). Read afresh, because
        that node's liveness socket closes right after it closed the rendezvous, sooner
        than the keeper's next read could show it."""
        with self._lock:
            known = self._snapshot
        if known is not None and known.closed:
            return known.closed_by_a_finished_node()
        try:
            _, state = self._read()
        except (RendezvousError, StoreConnectionError, StoreTimeoutError):
            return False
        return state.closed_by_a_finished_node()

    def num_nodes_waiting(self) -> int:
        with self._lock:
            return len(self._live_waiting_locked())

    def is_closed(self) -> bool:
        with self._lock:
            state = self._snapshot
        if state is None:
            try:
                _, state = self._read()
            except RendezvousError:
                return False
        return state.closed

    def set_closed(self, reason: str = "") -> None:
        reason = reason or f"closed by {self._name}"
        finished = self._node if self._finished else None
        deadline = time.monotonic() + self._settings.close_timeout
        while time.monotonic() < deadline:
            raw, state = self._read()
            new = closed_state(state, reason, finished)
            if new is None or self._cas(raw, state, new):
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
        self._sock_dead_into_dead()
        with self._lock:
            if self._running_round != round_:
                return f"round {round_} is no longer current"
            return self._change_reason_locked(for_barrier=True)

    def _sock_dead_into_dead(self) -> None:
        dead = self._sock_dead()
        if dead:
            with self._lock:
                self._dead |= dead & set(self._running_members)

    # -- next_rendezvous ----------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        self._raise_if_broken()
        with self._lock:
            self._running_round = None
            self._running_members = []
            self._signaled = False
        self._drain()
        self._release_port()
        self._reservation = PortReservation()
        machine = self._machine
        machine.begin()
        self._await_store(machine.deadline)
        while True:
            self._raise_if_broken()
            try:
                raw, state = self._read()
                step = machine.step(state, self._dead_now(), self._meta())
                if step.kind == "write":
                    assert step.state is not None
                    self._cas(raw, state, step.state)
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

    def fence_reason(self) -> str | None:
        """Why this node is fenced (cut off from the store for the keep-alive bound: its
        workers must stop, none may start), or None when it is not."""
        with self._lock:
            return self._fence_reason

    def wait_unfenced(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until this node is no longer fenced (or the store is
        lost for good: then the next call raises); True when it is not fenced."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._fence_reason is not None and self._store_lost is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wakeup.wait(remaining)
            return self._fence_reason is None

    def _await_store(self, deadline: float, renew: bool = False) -> None:
        """Wait out a fence (nothing can be decided without the store), then renew the
        main connection if it may have gone stale meanwhile (or ``renew``: a request on
        it went unanswered, so the stream is out of step)."""
        while self.fence_reason() is not None:
            self._raise_if_broken()
            if time.monotonic() > deadline:
                raise RendezvousConnectionError(self.fence_reason() or "fenced")
            self.wait_unfenced(min(1.0, max(0.0, deadline - time.monotonic())))
        self._raise_if_broken()
        if renew or self._contact.fences != self._client_fences:
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"rendezvous {self._run_id!r}: the store at {self._endpoint} did not "
                    f"answer within join_timeout={self._settings.join_timeout:g}s")
            self._client_fences = self._contact.fences
            old, self._client = self._client, self._client.clone()
            old.close()

    def _dead_now(self) -> set[str]:
        self._sock_dead_into_dead()
        dead = self._sock_dead()
        with self._lock:
            return set(self._dead) | dead

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
        with self._lock:
            self._running_round = state.round
            self._running_members = list(state.participants)
            self._running_restarts = state.restarts
            self._snapshot = state
            self._signaled = False
        self._drain()
        log.info("rendezvous %s round %d complete: rank %d of %d (%s), job restarts %d",
                 self._run_id, state.round, rank, len(state.participants), state.cause,
                 state.restarts)
        store = RoundStore(self._client, f"{self._prefix}r{state.round}/", self, state.round,
                           self._settings.keep_alive_interval)
        return RendezvousInfo(
            store=store, rank=rank, world_size=len(state.participants),
            bootstrap_store_info=RendezvousStoreInfo(str(master.get("addr") or self._addr),
                                                     int(master["port"]),
                                                     use_agent_store=self._agent_store is not None),
            round=state.round, restart_count=state.restarts,
        )

    def _withdraw(self, leaving: bool = False) -> None:
        """Remove this node from the state; a leaving participant of a running round
        opens the next round for the others at once."""
        deadline = time.monotonic() + min(self._settings.close_timeout, 5.0)
        while time.monotonic() < deadline:
            raw, state = self._read()
            new = withdrawn_state(state, self._node, leaving)
            if new is None or self._cas(raw, state, new):
                return

    def leave(self) -> None:
        """This node is going away (stopped by a signal): drop it now so the others
        re-rendezvous without waiting for its heartbeat to expire."""
        if self._left:
            return
        self._left = True
        if self.fence_reason() is not None:  # the others already count this node out
            log.info("leaving rendezvous %s while fenced: nothing to withdraw", self._run_id)
            return
        try:
            self._withdraw(leaving=True)
        except RendezvousError as e:
            log.warning("could not leave rendezvous %s cleanly: %s", self._run_id, e)

    def shutdown(self) -> bool:
        clean = True
        if not self._left and self._store_lost is None and self.fence_reason() is not None:
            clean = False  # cannot reach the store to close it; the others count us out
        elif not self._left and self._store_lost is None:
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
        self._stopped.set()
        self._release_port()
        keeper = getattr(self, "_keeper", None)
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=2 * self._settings.keep_alive_interval + 1)
        with self._lock:
            socks = list(self._live_socks.values())
            self._live_socks.clear()
        for sock in socks:
            sock.close()
        self._listener.close()
        self._client.close()
        if self._server is not None:
            self._server.stop()
            self._server = None
        for fd in (self._pipe_r, self._pipe_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._pipe_r = self._pipe_w = -1

    def __repr__(self) -> str:
        return (f"C10dRendezvousHandler(run_id={self._run_id!r}, endpoint={self._endpoint!r}, "
                f"node={self._name!r}, round={self._running_round}, "
                f"host={'yes' if self._server else 'no'})")
