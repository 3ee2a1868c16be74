"""``SimpleElasticAgent``: rendezvous -> start -> monitor -> restart, for one worker spec.

The control loop blocks in ``_wait_for_change`` (worker exits, membership news) for at
most ``monitor_interval`` and then decides; once its workers are healthy and everything
it watches wakes it (``_polls_nothing``), it waits longer (``SETTLED_WAIT``) and decides
again only when woken. Subclasses that only implement torch's abstract methods still work
(the default wait just sleeps, and looks every ``monitor_interval``).
"""

from __future__ import annotations

import abc
import logging
import signal
import time
from typing import Any

from harness.agent._api import (
    DEFAULT_ROLE,
    ElasticAgent,
    RunResult,
    WorkerGroup,
    WorkerSpec,
)
from harness.agent._decide import (
    Action,
    FenceClock,
    RestartCount,
    Tick,
    decide,
    exit_barrier_needed,
    is_failure,
    needs_membership_check,
)
from harness.agent._ranks import assign_worker_ranks
from harness.errors import ElasticError, SignalException
from harness.events import NullEventWriter
from harness.rendezvous import RendezvousGracefulExitError, RendezvousRoundAbandonedError
from harness.rendezvous._liveness import MONOTONIC
from harness.states import WorkerState

__all__ = ["SimpleElasticAgent"]

log = logging.getLogger(__name__)

_BARRIER_PREFIX = "torchelastic/agent/terminal_state"

#: How long the loop waits, at most, once its workers are healthy and every change it
#: watches for wakes it (``_polls_nothing``): a worker's exit, the rendezvous's news, the
#: watchdog. torch's agent looks every ``monitor_interval`` (0.1 s) because it polls; here
#: a look with nothing new is work for nothing, and a 128-node job's agents made 1280 of
#: them a second on two cores. The fence is still checked at each wake-up.
SETTLED_WAIT = 1.0


def _charge_restart(handler: Any) -> None:
    """Tell the rendezvous that this round's workers failed (it counts the job's
    restarts); a handler without the method keeps no count (the agent counts its own)."""
    charge = getattr(handler, "charge_restart", None)
    if charge is not None:
        charge()


def _fence_reason(handler: Any) -> str | None:
    """Why ``handler``'s node is cut off from its store (None: it is not, or the backend
    has no store to be cut off from)."""
    probe = getattr(handler, "fence_reason", None)
    return probe() if probe is not None else None


def _announce_leave(handler: Any, grace: float) -> None:
    """A termination signal: this node is going away. Tell the rendezvous *before* the
    workers are stopped (phase one; the launcher withdraws the node once they are gone),
    so the others read the leave before their collectives with our workers break and do
    not charge that as a failure of their own (with no restarts left it would end the job;
    seen under load in the main job's scale_down_leave). torch's agent has no graceful
    leave. Backends without the method skip this phase."""
    announce = getattr(handler, "announce_leave", None)
    if announce is None:
        return
    try:
        announce(grace)
    except Exception as e:  # stopping the workers must not wait on the store
        log.warning("could not announce the leave before stopping the workers: %s", e)


def _listen_for_refusals(handler: Any, listener: Any) -> None:
    """Hear of the connections that the store this agent may host refuses (a stranger,
    or an agent without the job secret). Backends without a store of ours have none."""
    listen = getattr(handler, "listen_for_refusals", None)
    if listen is not None:
        listen(listener)


def _mark_finished(handler: Any) -> None:
    """Tell ``handler`` this node's workers succeeded (backends without the notion ignore
    it): its close then does not stop the nodes still running."""
    mark = getattr(handler, "mark_finished", None)
    if mark is not None:
        mark()


class SimpleElasticAgent(ElasticAgent):
    """Supervises the workers of one ``WorkerSpec``; subclasses start/stop/monitor them."""

    def __init__(self, spec: WorkerSpec, exit_barrier_timeout: float = 300,
                 shutdown_timeout: float = 30, *, identical_workers: bool = False,
                 events: Any = None):
        if exit_barrier_timeout < 0:
            from harness.errors import ConfigError

            raise ConfigError("exit_barrier_timeout", exit_barrier_timeout, "must be >= 0")
        self._worker_group = WorkerGroup(spec)
        self._restarts = RestartCount(spec.max_restarts)
        self._store: Any = None
        self._exit_barrier_timeout = exit_barrier_timeout
        self._shutdown_timeout = shutdown_timeout
        self._identical_workers = identical_workers
        self._events = events or NullEventWriter()
        self._round = -1
        self._total_execution_time = 0.0
        self._last_progress = time.monotonic()
        _listen_for_refusals(spec.rdzv_handler, self._store_refused)

    def _store_refused(self, peer: str, reason: str) -> None:
        """The store hosted here refused ``peer`` (on the store's thread; a write to the
        event file is all it does). The timeline shows who knocked and when."""
        self._events.emit("store_refused", peer=peer, reason=reason, round=self._round)

    def get_event_succeeded(self) -> Any:
        """torch's name: the agent-level ``SUCCEEDED`` event (an ``AgentEvent``)."""
        from harness.agent._api import AgentEvent

        return AgentEvent.for_group(self._worker_group, "SUCCEEDED", self._total_execution_time,
                                    self.restart_count)

    def get_event_failed(self) -> Any:
        """torch's name: the agent-level ``FAILED`` event, with the current traceback."""
        import traceback

        from harness.agent._api import AgentEvent

        return AgentEvent.for_group(self._worker_group, "FAILED", self._total_execution_time,
                                    self.restart_count, raw_error=traceback.format_exc())

    # -- the contract subclasses fill --------------------------------------------------

    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        return self._worker_group

    @abc.abstractmethod
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start ``local_world_size`` workers; return local_rank -> worker id."""

    @abc.abstractmethod
    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """Stop every worker of the group, whatever its state (stuck ones included)."""

    @abc.abstractmethod
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """Look at the workers now and return the group's state (non-blocking)."""

    @abc.abstractmethod
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        """Final cleanup: stop workers with ``death_sig``, release everything."""

    def _wait_for_change(self, worker_group: WorkerGroup, timeout: float) -> bool:
        """Block up to ``timeout`` s or until something may have changed; False only when
        it knows nothing did (no worker exited, no news: the timeout passed). This default
        cannot tell: it sleeps and says True."""
        time.sleep(timeout)
        return True

    def _polls_nothing(self) -> bool:
        """Whether everything ``_monitor_workers`` looks at wakes ``_wait_for_change``
        when it moves (then a quiet wait after a healthy look needs no new look). This
        default cannot tell: False."""
        return False

    # -- state -------------------------------------------------------------------------

    @property
    def restart_count(self) -> int:
        """The restart count of the round this agent runs: the job's (see ``RestartCount``)."""
        return self._restarts.current

    @property
    def _remaining_restarts(self) -> int:
        """Restarts the job has left: torch's agent keeps this attribute, and code written
        against torch (its own agent tests among it) reads it."""
        return self._restarts.remaining

    def _set_state(self, state: WorkerState) -> None:
        group = self._worker_group
        if group.state != state:
            group.state = state
            self._events.emit("state", state=state.value, role=group.spec.role,
                              restart_count=self.restart_count, round=self._round)

    # -- rendezvous, start, restart ----------------------------------------------------

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        spec = worker_group.spec
        started = time.monotonic()
        while True:
            info = spec.rdzv_handler.next_rendezvous()
            self._round = info.round
            self._store = info.store
            self._restarts.adopt(getattr(info, "restart_count", None))  # None: a foreign handler
            try:
                workers = assign_worker_ranks(info.store, info.rank, info.world_size, spec,
                                              identical=self._identical_workers)
                break
            except RendezvousRoundAbandonedError as e:
                # A member was lost (or the store went quiet) between the round's completion
                # and its ranks: the round is over, not the job. Its workers never started,
                # so nothing is charged; the next round (or a closed rendezvous) decides.
                log.info("[%s] round %d ended before its ranks were assigned (%s); re-rendezvous",
                         spec.role, info.round, e)
                self._events.emit("membership_change", restart_count=self.restart_count, cause="membership")
        worker_group.workers = workers
        worker_group.store = info.store
        worker_group.group_rank = info.rank
        worker_group.group_world_size = info.world_size
        boot = info.bootstrap_store_info
        worker_group.master_addr = spec.master_addr or boot.master_addr
        worker_group.master_port = spec.master_port or boot.master_port
        self._use_agent_store = boot.use_agent_store
        self._events.emit(
            "rendezvous", round=info.round, group_rank=info.rank,
            group_world_size=info.world_size, world_size=workers[0].world_size,
            ranks=[w.global_rank for w in workers], master_addr=worker_group.master_addr,
            master_port=worker_group.master_port, restart_count=self.restart_count,
            duration=time.monotonic() - started,
        )

    def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        self._rendezvous(worker_group)
        ids = self._start_workers(worker_group)
        for worker in worker_group.workers:
            worker.id = ids[worker.local_rank]
        self._set_state(WorkerState.HEALTHY)

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        self._stop_workers(worker_group)
        self._set_state(WorkerState.STOPPED)
        self._initialize_workers(worker_group)

    # -- the loop ----------------------------------------------------------------------

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        started = time.monotonic()
        shut_down = False
        self._events.emit("state", state=WorkerState.INIT.value, role=role,
                          restart_count=0, round=-1)
        try:
            result = self._invoke_run(role)
        except RendezvousGracefulExitError as e:
            log.info("rendezvous asked this node to leave: %s", e)
            result = RunResult(WorkerState.SUCCEEDED)
        except SignalException as e:
            log.warning("received %s, stopping workers", e.sigval.name)
            _announce_leave(self._worker_group.spec.rdzv_handler, self._shutdown_timeout)
            self._shutdown(e.sigval)
            shut_down = True
            raise
        finally:
            if not shut_down:
                self._shutdown()
            self._total_execution_time = time.monotonic() - started
        self._events.emit("result", result=result.to_json(), restart_count=self.restart_count)
        return result

    def _invoke_run(self, role: str) -> RunResult:
        group = self._worker_group
        spec = group.spec
        self._initialize_workers(group)
        settled = False  # the last look found the workers healthy, and nothing is polled
        while True:
            wait = max(spec.monitor_interval, SETTLED_WAIT) if settled else spec.monitor_interval
            stirred = self._wait_for_change(group, wait)
            self._last_progress = time.monotonic()
            if settled and not stirred and _fence_reason(spec.rdzv_handler) is None:
                continue
            settled = False
            result = self._monitor_workers(group)
            state = result.state
            if is_failure(state):
                self._set_state(state)  # recorded before the (possibly slow) verdict below
            fenced = _fence_reason(spec.rdzv_handler)
            changed = (fenced is None and needs_membership_check(state)
                       and spec.rdzv_handler.membership_changed(confirm=is_failure(state)))
            if changed:  # the check may wait out this node's keep-alive bound: a fence then, not a change
                fenced = _fence_reason(spec.rdzv_handler)
            decision = decide(Tick(state, changed, fenced), self._restarts.remaining)
            action = decision.action
            if action is Action.WAIT:
                settled = state == WorkerState.HEALTHY and self._polls_nothing()
                continue
            self._set_state(state)
            if action is Action.SUCCEED:
                _mark_finished(spec.rdzv_handler)
                self._exit_barrier()
                return result
            if action is Action.FENCE:
                self._fence(group, decision.cause)
            elif action is Action.REFORM:
                if decision.cause == "failure":
                    log.info("[%s] workers failed after the membership changed; re-rendezvous "
                             "without using a restart", role)
                else:
                    log.info("[%s] the membership changed; restarting with the new world", role)
                self._events.emit("membership_change", restart_count=self.restart_count,
                                  cause=decision.cause)
                self._restart_workers(group)
            elif action is Action.RESTART:
                log.info("[%s] worker group %s; %d/%d restarts left", role, state.value,
                         self._restarts.remaining, spec.max_restarts)
                self._restarts.charge()
                _charge_restart(spec.rdzv_handler)
                self._restart_workers(group)
            elif action is Action.GIVE_UP:
                self._stop_workers(group)
                self._set_state(WorkerState.FAILED)
                log.error("[%s] worker group failed; %s used all %d restart(s)", role,
                          "the job has" if self._restarts.job_wide else "this agent has",
                          spec.max_restarts)
                return RunResult(WorkerState.FAILED, failures=result.failures)
            else:
                raise ElasticError(f"[{role}] worker group is in state {state.value}; giving up")

    # -- fencing -----------------------------------------------------------------------

    _clock: Any = MONOTONIC  # the fence timer's clock (a FakeClock in tests)

    def _fence(self, group: WorkerGroup, reason: str) -> None:
        """Cut off from the rendezvous store for the keep-alive bound: the others are
        re-forming without this node, so its workers stop now (they must not go on in a
        world that no longer exists) and none start until the store answers; then the
        node rejoins as a new member, or learns that the job has ended."""
        handler = group.spec.rdzv_handler
        fence = FenceClock(self._clock)
        fence.begin()
        log.warning("%s; stopping the workers until the store answers", reason)
        self._stop_workers(group)
        self._set_state(WorkerState.STOPPED)
        self._events.emit("fenced", reason=reason, restart_count=self.restart_count,
                          round=self._round)
        while not handler.wait_unfenced(group.spec.monitor_interval + 1.0):
            self._last_progress = time.monotonic()  # alive, deliberately idle
        lasted = fence.end()
        log.warning("the rendezvous store answers again after %.1fs fenced; rejoining", lasted)
        self._events.emit("unfenced", fenced_for=round(lasted, 3),
                          restart_count=self.restart_count, round=self._round)
        self._initialize_workers(group)

    def last_progress(self) -> float:
        """Monotonic time the control loop last made progress (the health check reads it;
        the exit barrier counts as progress)."""
        if self._in_exit_barrier:
            return time.monotonic()
        return self._last_progress

    _in_exit_barrier = False

    def _exit_barrier(self) -> None:
        """Wait (bounded) until every node is done, so no node's store vanishes early."""
        group = self._worker_group
        store = self._store
        fenced = _fence_reason(group.spec.rdzv_handler) is not None
        size = group.group_world_size or 1
        if not exit_barrier_needed(store is not None, size, fenced):
            if fenced:
                log.warning("skipping the exit barrier: this node cannot reach the store")
            return
        started = time.monotonic()
        self._in_exit_barrier = True
        try:
            from harness.rendezvous._barrier import store_barrier

            store_barrier(store, size, _BARRIER_PREFIX, self._exit_barrier_timeout)
        except Exception as e:  # a dead peer must not turn a success into a crash
            log.warning("exit barrier did not complete after %.1fs: %s",
                        time.monotonic() - started, e)
        finally:
            self._in_exit_barrier = False
