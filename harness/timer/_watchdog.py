"""The agent's worker watchdog: one ``FileTimerServer`` per agent, bound to its workers.

What torch's agent does with ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` (a FileTimerServer
whose FIFO path is exported to workers as ``TORCHELASTIC_TIMER_FILE``), minus its
flaws: the server never kills the agent, honours only the current workers, and tells
the agent which worker and scope expired so the agent can record ``timer_expired``.
"""

from __future__ import annotations

import logging
import os
import signal as _signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.timer._api import TimerExpiry
from harness.timer._clock import Clock
from harness.timer._file import FileTimerServer
from harness.timer_env import ENABLE_FILE_TIMER_ENV, TIMER_FILE_ENV

__all__ = ["AgentWatchdog", "WorkerTimerExpired", "TIMER_FILE_ENV", "ENABLE_FILE_TIMER_ENV"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class WorkerTimerExpired:
    """A worker's timer expired: which worker, which scopes (earliest deadline first),
    the signal it was sent (0: none asked for, the worker was left running)."""

    local_rank: int | None  # None if the pid is no longer in the current worker map
    pid: int
    scopes: tuple[str, ...]
    signal: int
    reaped: bool
    lateness: float

    def as_event(self) -> dict[str, Any]:
        """The fields of a ``timer_expired`` event for the event stream."""
        try:
            sig: int | str = _signal.Signals(self.signal).name if self.signal > 0 else 0
        except ValueError:
            sig = self.signal
        return {"kind": "timer_expired", "local_rank": self.local_rank, "pid": self.pid,
                "scope": self.scopes[0] if self.scopes else None, "scopes": list(self.scopes),
                "signal": sig, "reaped": self.reaped, "lateness": round(self.lateness, 6)}


class AgentWatchdog:
    """A ``FileTimerServer`` for one agent. Contract, in the order the agent uses it:

    * ``AgentWatchdog(run_id, enabled, file_path=None, on_expired=cb)``, or
      ``AgentWatchdog.from_env(run_id, env, on_expired=cb)`` which reads
      ``TORCHELASTIC_ENABLE_FILE_TIMER`` ("1" enables) and ``TORCHELASTIC_TIMER_FILE``
      (explicit FIFO path) once. Disabled: every method is a cheap no-op and
      ``worker_env()`` is ``{}``.
    * ``start()`` once, before the first worker group starts: creates the FIFO (a
      private 0700 directory unless ``file_path`` was given) and starts the thread.
    * ``worker_env()`` -> ``{"TORCHELASTIC_TIMER_FILE": path}``: merge into every
      worker's environment (torch's and our ``FileTimerClient`` read it there).
    * ``set_workers({local_rank: pid})`` right after each worker group started (and
      ``set_workers({})`` once it stopped): only these processes' requests count; a
      request that arrived before its worker was registered is held (up to 10 s) and
      applied then; timers of workers no longer listed are dropped.
    * ``on_expired(WorkerTimerExpired)`` is called on the watchdog thread after the
      worker was signalled (SIGKILL unless the worker's client asked otherwise). It
      must be quick and thread-safe: enqueue a ``timer_expired`` event
      (``expired.as_event()``) and let the agent's loop restart the group; the killed
      worker's exit is seen by the agent's normal monitoring as well, possibly first:
      ``expiry_of(pid)`` then tells whether the watchdog killed it.
    * ``on_failed(error)`` (optional) is called if the watchdog thread dies;
      ``healthy`` turns False and ``error`` holds the exception.
    * ``stop()``: idempotent, returns promptly, removes the FIFO (and its directory).
    """

    def __init__(self, run_id: str, enabled: bool, file_path: str | None = None,
                 on_expired: Callable[[WorkerTimerExpired], None] | None = None, *,
                 on_failed: Callable[[BaseException | None], None] | None = None,
                 max_interval: float = 10.0, clock: Clock | None = None):
        self.run_id = run_id
        self.enabled = bool(enabled)
        self._requested_path = file_path
        self._on_expired = on_expired
        self._on_failed = on_failed
        self._max_interval = max_interval
        self._clock = clock
        self._server: FileTimerServer | None = None
        self._ranks: dict[int, int] = {}  # pid -> local_rank
        self._stopped = False

    @classmethod
    def from_env(cls, run_id: str, env: Mapping[str, str] | None = None,
                 on_expired: Callable[[WorkerTimerExpired], None] | None = None,
                 **kwargs: Any) -> AgentWatchdog:
        env = os.environ if env is None else env
        return cls(run_id, env.get(ENABLE_FILE_TIMER_ENV, "0") == "1",
                   env.get(TIMER_FILE_ENV) or None, on_expired, **kwargs)

    def start(self) -> None:
        if not self.enabled:
            return
        if self._server is not None or self._stopped:
            raise RuntimeError("AgentWatchdog can be started only once")
        self._server = FileTimerServer(self._requested_path, self.run_id, self._max_interval,
                                       log_event=self._log_event, clock=self._clock,
                                       workers={}, on_expired=self._expired)
        self._server.start()

    @property
    def file_path(self) -> str | None:
        return None if self._server is None else self._server.file_path

    def worker_env(self) -> dict[str, str]:
        if not self.enabled:
            return {}
        if self._server is None:
            raise RuntimeError("AgentWatchdog.worker_env() called before start()")
        return {TIMER_FILE_ENV: self._server.file_path}

    def set_workers(self, workers: Mapping[int, int]) -> None:
        """``{local_rank: pid}`` of the current worker group (``{}``: none)."""
        if self._server is None:
            return
        self._ranks = {pid: rank for rank, pid in workers.items()}
        self._server.set_workers(list(self._ranks))

    @property
    def healthy(self) -> bool:
        """False once the watchdog thread died (disabled or not started: True)."""
        return self._server is None or self._stopped or self._server.is_alive()

    @property
    def error(self) -> BaseException | None:
        return None if self._server is None else self._server.error

    def stop(self) -> None:
        self._stopped = True
        if self._server is not None:
            self._server.stop()

    def expiry_of(self, pid: int) -> WorkerTimerExpired | None:
        """The expiry that made the watchdog signal ``pid``, or None. Unlike
        ``on_expired`` (called after the signal), this answers as soon as the signal is
        sent: the agent asks it when it sees a worker die before the callback ran."""
        expiry = None if self._server is None else self._server.reaped(pid)
        return None if expiry is None else self._as_worker_expiry(expiry)

    def _as_worker_expiry(self, expiry: TimerExpiry) -> WorkerTimerExpired:
        return WorkerTimerExpired(self._ranks.get(expiry.worker_id), expiry.worker_id,
                                  expiry.scope_ids, expiry.signal, expiry.reaped, expiry.lateness)

    def _expired(self, expiry: TimerExpiry) -> None:
        expired = self._as_worker_expiry(expiry)
        log.warning("worker local_rank=%s pid=%d: timer %s expired%s", expired.local_rank,
                    expired.pid, ", ".join(expired.scopes),
                    f", sent {expired.as_event()['signal']}" if expired.signal > 0 else "")
        if self._on_expired is not None:
            self._on_expired(expired)

    def _log_event(self, name: str, request: Any) -> None:
        log.debug("watchdog event %r: %r", name, request)
        if name == "watchdog failed" and self._on_failed is not None:
            self._on_failed(self.error)

    def __enter__(self) -> AgentWatchdog:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        if not self.enabled:
            return "<AgentWatchdog disabled>"
        return f"<AgentWatchdog run_id={self.run_id!r} server={self._server!r}>"
