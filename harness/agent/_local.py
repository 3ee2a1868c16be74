"""``LocalElasticAgent``: runs the workers of one node as local processes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from harness.agent._api import RunResult, WorkerGroup, WorkerSpec
from harness.agent._simple import SimpleElasticAgent
from harness.errors import ConfigError, ElasticError, ProcessFailure
from harness.events import event_writer_from_env
from harness.procs import START_METHODS, LogsSpecs, ProcessContext
from harness.procs._logs import as_logs_specs
from harness.rendezvous import SECRET_ENVS
from harness.selfpipe import close_pipe, drain_pipe, self_pipe, wake_pipe
from harness.states import WorkerState
from harness.timer_env import ENABLE_FILE_TIMER_ENV
from harness.timer_env import TIMER_FILE_ENV as TORCHELASTIC_TIMER_FILE

__all__ = ["LocalElasticAgent", "AgentEnv", "TORCHELASTIC_HEALTH_CHECK_PORT",
           "TORCHELASTIC_TIMER_FILE"]

log = logging.getLogger(__name__)

# environment variables the agent reads (once, at construction)
#: "1": the agent treats its workers as identical (torch's rank assignment shortcut)
WORKER_IDENTICAL_ENV = "TORCH_ELASTIC_WORKER_IDENTICAL"
#: the template of the prefix of each worker output line (torchrun's ``--log-line-prefix-template``)
LOG_LINE_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
#: seconds the agent waits for workers in an uninterruptible state before it gives up on them
UNINTERRUPTIBLE_TIMEOUT_ENV = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"
#: given to every worker ("1" unless set): NCCL errors end the worker instead of hanging it
NCCL_ASYNC_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
#: the port of the agent's health check server (torch's; unset: none)
HEALTH_CHECK_PORT_ENV = TORCHELASTIC_HEALTH_CHECK_PORT = "TORCHELASTIC_HEALTH_CHECK_PORT"
#: the signals the agent turns into a clean stop of its workers (comma-separated names)
SIGNALS_TO_HANDLE_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
HEALTH_CHECK_TIMEOUT = 60.0  # torch's agent uses 60 s too


@dataclass(frozen=True)
class AgentEnv:
    """What the agent takes from its environment, resolved once."""

    base: Mapping[str, str]
    identical_workers: bool
    log_line_prefix_template: str | None
    uninterruptible_state_timeout: float | None
    health_check_port: int | None

    @classmethod
    def resolve(cls, env: Mapping[str, str] | None) -> AgentEnv:
        base = dict(os.environ if env is None else env)
        for name in SECRET_ENVS:  # the rendezvous store's job secret is the agent's alone
            base.pop(name, None)
        timeout = base.get(UNINTERRUPTIBLE_TIMEOUT_ENV)
        try:
            d_timeout = float(timeout) if timeout else None
        except ValueError:
            raise ConfigError(UNINTERRUPTIBLE_TIMEOUT_ENV, timeout, "must be a number of seconds") from None
        port_text = base.get(HEALTH_CHECK_PORT_ENV)
        if port_text and not port_text.isdigit():
            raise ConfigError(HEALTH_CHECK_PORT_ENV, port_text, "must be a port number")
        return cls(
            health_check_port=int(port_text) if port_text else None,
            base=base,
            identical_workers=base.get(WORKER_IDENTICAL_ENV, "0") == "1",
            log_line_prefix_template=base.get(LOG_LINE_PREFIX_ENV) or None,
            uninterruptible_state_timeout=d_timeout if d_timeout and d_timeout > 0 else None,
        )


@contextlib.contextmanager
def _secret_withheld() -> Iterator[None]:
    """Keep the job secret out of this process's environment while workers start. A
    callable's worker (spawn, fork, forkserver) inherits the agent's environment and
    only adds its own, and the workers must never hold the secret."""
    held = {name: os.environ.pop(name) for name in SECRET_ENVS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(held)


def _substitute_local_rank(args: tuple[Any, ...], local_rank: int) -> tuple[Any, ...]:
    """torch's ``macros.substitute``: ``${local_rank}`` in string args -> the local rank."""
    return tuple(a.replace("${local_rank}", str(local_rank)) if isinstance(a, str) else a
                 for a in args)


class LocalElasticAgent(SimpleElasticAgent):
    """Starts, watches (by waiting on exit descriptors) and stops local workers."""

    def __init__(self, spec: WorkerSpec, logs_specs: LogsSpecs | Any = None,
                 start_method: str = "spawn", exit_barrier_timeout: float = 300,
                 log_line_prefix_template: str | None = None, shutdown_timeout: float = 30,
                 health_check_server: Any = None,
                 uninterruptible_state_timeout: float | None = None, *,
                 env: Mapping[str, str] | None = None, events: Any = None, node_name: str | None = None,
                 zygote: Any = None, signals_to_handle: str | None = None):
        if start_method not in START_METHODS:
            raise ConfigError("start_method", start_method, f"must be one of {', '.join(START_METHODS)}",
                              "--start-method")
        if shutdown_timeout < 0:
            raise ConfigError("shutdown_timeout", shutdown_timeout, "must be >= 0", "--shutdown-timeout")
        self._env = AgentEnv.resolve(env)
        if events is None:
            events = event_writer_from_env(self._env.base, spec.rdzv_handler.get_run_id(),
                                           node_name or os.uname().nodename)
        super().__init__(spec, exit_barrier_timeout, shutdown_timeout,
                         identical_workers=self._env.identical_workers, events=events)
        self._logs_specs = as_logs_specs(logs_specs)  # torch's LogsSpecs shape accepted too
        self._start_method = start_method
        self._log_line_prefix_template = log_line_prefix_template or self._env.log_line_prefix_template
        self._d_timeout = uninterruptible_state_timeout or self._env.uninterruptible_state_timeout
        if health_check_server is None and self._env.health_check_port is not None:
            from harness.agent._health import HealthCheckServer

            health_check_server = HealthCheckServer(self.last_progress, self._env.health_check_port,
                                                    HEALTH_CHECK_TIMEOUT)
        self._health_check_server = health_check_server
        self._signals_to_handle = signals_to_handle
        self._watchdog = self._make_watchdog(spec.rdzv_handler.get_run_id())
        self._expired: dict[int, Any] = {}  # pid -> WorkerTimerExpired (set on the watchdog thread)
        self._watchdog_error: BaseException | None = None
        self._wake_r, self._wake_w = self_pipe()  # the watchdog thread wakes the agent loop
        self._owns_zygote = zygote is None and start_method == "zygote"
        if self._owns_zygote:
            from harness.procs._zygote_client import Zygote

            zygote = Zygote.for_agent(self._env.base)  # starts now: overlaps the rendezvous
        self._zygote = zygote
        self._pcontext: ProcessContext | None = None
        self._reported_exits: set[int] = set()
        self._d_since: dict[int, float] = {}
        self._use_agent_store = False
        self._health_started = False

    # -- the timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1) --------------------------

    def _make_watchdog(self, run_id: str) -> Any:
        if self._env.base.get(ENABLE_FILE_TIMER_ENV, "0") != "1":
            return None
        from harness.timer import AgentWatchdog

        return AgentWatchdog.from_env(run_id, self._env.base, on_expired=self._on_timer_expired,
                                      on_failed=self._on_watchdog_failed)

    def _wake(self) -> None:
        wake_pipe(self._wake_w)  # a full pipe: already awake

    def _on_timer_expired(self, expired: Any) -> None:
        """Watchdog thread: remember which scope killed whom; the loop does the rest."""
        self._expired[expired.pid] = expired
        fields = expired.as_event()
        fields.pop("kind")
        rank = expired.local_rank
        self._events.emit("timer_expired", **fields, restart_count=self.restart_count,
                          round=self._round,
                          rank=None if rank is None else self._global_rank(rank))
        self._wake()

    def _on_watchdog_failed(self, error: BaseException | None) -> None:
        self._watchdog_error = error or ElasticError("the timer watchdog thread stopped")
        self._wake()

    def _timer_message(self, failure: ProcessFailure) -> None:
        expired = self._expired.get(failure.pid)
        if expired is None and self._watchdog is not None:  # died before on_expired ran
            expired = self._watchdog.expiry_of(failure.pid)
        if expired is not None:
            sig = expired.as_event()["signal"]
            failure.message = (f"timer expired in scope {expired.scopes[0] if expired.scopes else '?'}"
                               f" (late by {expired.lateness * 1000:.0f} ms); worker killed with {sig}")

    # -- start -------------------------------------------------------------------------

    def _worker_envs(self, group: WorkerGroup) -> dict[int, dict[str, str]]:
        spec = group.spec
        base = self._env.base
        envs = {}
        for worker in group.workers:
            env = dict(base)
            env.update({
                "LOCAL_RANK": str(worker.local_rank),
                "RANK": str(worker.global_rank),
                "GROUP_RANK": str(group.group_rank),
                "ROLE_RANK": str(worker.role_rank),
                "ROLE_NAME": spec.role,
                "LOCAL_WORLD_SIZE": str(spec.local_world_size),
                "WORLD_SIZE": str(worker.world_size),
                "GROUP_WORLD_SIZE": str(group.group_world_size),
                "ROLE_WORLD_SIZE": str(worker.role_world_size),
                "MASTER_ADDR": str(group.master_addr),
                "MASTER_PORT": str(group.master_port),
                "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
                "TORCHELASTIC_USE_AGENT_STORE": str(self._use_agent_store),
                NCCL_ASYNC_ENV: base.get(NCCL_ASYNC_ENV, "1"),
            })
            if self._signals_to_handle:  # a launcher nested in a worker reads it (as torch's)
                env[SIGNALS_TO_HANDLE_ENV] = self._signals_to_handle
            if self._watchdog is not None:
                env.update(self._watchdog.worker_env())
            if spec.virtual_local_rank:
                env["LOCAL_RANK"] = "0"
                visible = base.get("CUDA_VISIBLE_DEVICES")
                devices = visible.split(",") if visible else None
                env["CUDA_VISIBLE_DEVICES"] = (devices[worker.local_rank] if devices
                                               else str(worker.local_rank))
            envs[worker.local_rank] = env
        return envs

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec = worker_group.spec
        if self._health_check_server is not None and not self._health_started:
            self._health_check_server.start()
            self._health_started = True
        if self._watchdog is not None and self._watchdog.file_path is None:
            self._watchdog.start()
        logs = self._logs_specs.reify(
            spec.rdzv_handler.get_run_id(), self.restart_count, spec.role,
            {w.local_rank: w.global_rank for w in worker_group.workers},
            self._log_line_prefix_template,
        )
        args = {w.local_rank: _substitute_local_rank(spec.args, w.local_rank)
                for w in worker_group.workers}
        assert spec.entrypoint is not None  # WorkerSpec.__post_init__ rejects None
        self._pcontext = ProcessContext(spec.role, spec.entrypoint, args,
                                        self._worker_envs(worker_group), logs,
                                        self._start_method, zygote=self._zygote)
        self._reported_exits.clear()
        self._d_since.clear()
        with _secret_withheld():
            self._pcontext.start()
        pids = self._pcontext.pids()
        self._expired.clear()
        if self._watchdog is not None:
            self._watchdog.set_workers(pids)
        if self._events.enabled:
            from harness.procs._handles import process_start_time

            for worker in worker_group.workers:
                pid = pids[worker.local_rank]
                self._events.emit("worker_start", local_rank=worker.local_rank,
                                  rank=worker.global_rank, world_size=worker.world_size,
                                  worker_pid=pid, start_time=process_start_time(pid),
                                  restart_count=self.restart_count, round=self._round)
        return pids

    # -- watch -------------------------------------------------------------------------

    def _wait_for_change(self, worker_group: WorkerGroup, timeout: float) -> bool:
        if self._pcontext is None:
            return True
        news = worker_group.spec.rdzv_handler.event_fd()
        fds = (self._wake_r,) if news is None else (self._wake_r, news)
        woken = self._pcontext.wait(timeout, extra_fds=fds)
        if self._wake_r in woken.fds:
            drain_pipe(self._wake_r)
        return not woken.quiet

    def _polls_nothing(self) -> bool:
        # a worker's exit wakes the wait (its fd), the watchdog writes the wake pipe;
        # only a stuck worker's D state has nothing to wake it: it is looked for each tick
        return self._d_timeout is None and self._watchdog_error is None

    def _global_rank(self, local_rank: int) -> int:
        return self._worker_group.workers[local_rank].global_rank

    def _report_exits(self) -> None:
        assert self._pcontext is not None
        for rank, proc in self._pcontext.procs.items():
            if proc.exitcode is not None and rank not in self._reported_exits:
                self._reported_exits.add(rank)
                reason = self._pcontext.exit_reason(rank)
                self._events.emit("worker_exit", local_rank=rank, rank=self._global_rank(rank),
                                  worker_pid=proc.pid, exitcode=proc.exitcode,
                                  restart_count=self.restart_count, round=self._round,
                                  **({"reason": reason} if reason else {}))

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        pc = self._pcontext
        if pc is None:
            return RunResult(WorkerState.UNKNOWN)
        if self._watchdog_error is not None:
            raise ElasticError(f"the timer watchdog died ({self._watchdog_error}); workers' "
                               "timers can no longer expire")
        result = pc.poll()
        self._report_exits()
        if result is None:
            if self._d_timeout is not None:
                stuck = pc.uninterruptible(self._d_since, self._d_timeout)
                if stuck:
                    return RunResult(WorkerState.UNHEALTHY, failures=self._stuck_failures(stuck))
            return RunResult(WorkerState.HEALTHY)
        if result.is_failed():
            for failure in result.failures.values():
                self._timer_message(failure)
            return RunResult(WorkerState.FAILED, failures={
                self._global_rank(r): f for r, f in result.failures.items()})
        return RunResult(WorkerState.SUCCEEDED, return_values={
            self._global_rank(r): v for r, v in result.return_values.items()})

    def _stuck_failures(self, ranks: list[int]) -> dict[int, ProcessFailure]:
        assert self._pcontext is not None
        failures = {}
        for rank in ranks:
            proc = self._pcontext.procs[rank]
            failure = ProcessFailure(rank, proc.pid, -int(signal.SIGKILL), "")
            failure.message = (f"worker stuck in uninterruptible state (D) for more than "
                               f"{self._d_timeout:g}s; killed")
            failures[self._global_rank(rank)] = failure
        return failures

    # -- stop --------------------------------------------------------------------------

    def _close_workers(self, death_sig: int) -> None:
        if self._pcontext is None:
            return
        if self._watchdog is not None:
            self._watchdog.set_workers({})
        unkillable = self._pcontext.close(death_sig, self._shutdown_timeout)
        self._report_exits()
        if unkillable:
            self._events.emit("worker_unkillable", pids=unkillable)
        self._pcontext = None

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._close_workers(signal.SIGTERM)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        try:
            self._close_workers(death_sig)
        finally:
            if self._health_started:
                self._health_check_server.stop()
                self._health_started = False
            if self._watchdog is not None:
                self._watchdog.stop()
            close_pipe(self._wake_r, self._wake_w)
            self._wake_r = self._wake_w = -1
            if self._owns_zygote and self._zygote is not None:
                self._zygote.close()
                self._zygote = None
            self._logs_specs.cleanup()
