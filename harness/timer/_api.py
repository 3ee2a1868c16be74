"""The timer protocol: requests, the client and server bases, ``configure`` and ``expires``.

Same names, signatures and wire meaning as ``torch.distributed.elastic.timer``: a client
sends ``TimerRequest(worker_id, scope_id, expiration_time)`` where ``expiration_time``
is wall-clock seconds (``time.time() + after``) and a negative value means "release".
What differs is inside the server (see ``TimerServer``): deadlines are kept on a
monotonic clock and the watchdog sleeps until the nearest one, not for ``max_interval``.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

from harness.errors import ConfigError, ElasticError
from harness.timer._clock import Clock, MonotonicClock

__all__ = [
    "TimerRequest",
    "TimerClient",
    "TimerServer",
    "TimerExpiry",
    "TimerUnavailableError",
    "configure",
    "expires",
]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_S = TypeVar("_S", bound="TimerServer")


class TimerUnavailableError(ElasticError, BrokenPipeError):
    """The timer server could not be reached (torch raises BrokenPipeError here too)."""


class TimerRequest:
    """One acquire or release, as sent from a client to a server.

    ``worker_id`` identifies the worker (a pid for the servers in this package);
    a negative ``expiration_time`` is a release of ``scope_id``.
    """

    __slots__ = ("worker_id", "scope_id", "expiration_time")

    def __init__(self, worker_id: Any, scope_id: str, expiration_time: float):
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimerRequest):
            return (self.worker_id, self.scope_id, self.expiration_time) == (
                other.worker_id,
                other.scope_id,
                other.expiration_time,
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like torch's

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(worker_id={self.worker_id!r}, "
                f"scope_id={self.scope_id!r}, expiration_time={self.expiration_time!r})")


@dataclass(frozen=True)
class TimerExpiry:
    """What a server did about one worker whose timers expired (passed to ``on_expired``).

    ``scope_ids`` lists the expired scopes, earliest deadline first; ``signal`` is the
    signal sent (0 when every expired timer asked for none); ``reaped`` is True once
    the worker was signalled (or found already gone); ``lateness`` is seconds from the
    earliest deadline to the reap, on the server's clock.
    """

    worker_id: Any
    scope_ids: tuple[str, ...]
    signal: int
    reaped: bool
    lateness: float


class TimerClient(abc.ABC):
    """Acquires and releases countdown timers for the worker that holds it."""

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Ask for this worker to be reaped at wall-clock ``expiration_time``."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """Cancel the timer on ``scope_id``; after this it no longer fires."""


def _check_interval(max_interval: float) -> float:
    if isinstance(max_interval, bool) or not isinstance(max_interval, (int, float)) or not (
        math.isfinite(max_interval) and max_interval > 0
    ):
        raise ConfigError("max_interval", max_interval, "must be a finite number of seconds > 0")
    return float(max_interval)


class TimerServer(abc.ABC):
    """Watches timers and reaps the workers whose timers expired, on a thread of its own.

    Subclasses implement ``register_timers``, ``clear_timers``, ``get_expired_timers``
    and ``_reap_worker`` as in torch. The loop here is: wait for requests (``_receive``)
    at most until ``_next_wakeup()`` or ``max_interval``, register them with any sent
    meanwhile, expire what is due. The servers of this package make ``_next_wakeup`` the nearest deadline, so a
    timer fires at its deadline whatever ``max_interval`` is; ``max_interval`` only
    bounds how long a wait can last (housekeeping). ``stop()`` wakes the loop
    (``_wake``) instead of waiting out the interval.

    A watchdog thread that dies is not silent: ``error`` holds the exception,
    ``is_alive()`` turns False and the failure is logged (and reported via
    ``_on_watchdog_failed``).
    """

    def __init__(self, request_queue: Any = None, max_interval: float = 60, daemon: bool = True,
                 *, clock: Clock | None = None):
        self._request_queue = request_queue
        self._max_interval = _check_interval(max_interval)
        self._daemon = daemon
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._stopped = False
        self.error: BaseException | None = None

    # ---- what a concrete server provides ---------------------------------------------

    @abc.abstractmethod
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquires and releases (negative ``expiration_time``)."""

    @abc.abstractmethod
    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Forget every timer of ``worker_ids``."""

    @abc.abstractmethod
    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """Timers with ``expiration_time <= deadline`` (wall clock, as on the wire), per worker."""

    @abc.abstractmethod
    def _reap_worker(self, worker_id: Any) -> bool:
        """Reap one worker; True if reaped (or already gone), False to retry later."""

    # ---- hooks with torch-like defaults ----------------------------------------------

    def _receive(self, timeout: float | None) -> list[Any]:
        """Block up to ``timeout`` seconds (None: until woken) for requests."""
        if self._request_queue is None:
            self._stop_event.wait(timeout)
            return []
        size = max(1, self._request_queue.size())
        requests: list[Any] = self._request_queue.get(size, self._max_interval if timeout is None else timeout)
        return requests

    def _next_wakeup(self) -> float | None:
        """The server-clock time at which the loop must next run, None if only housekeeping."""
        return None

    def _expire_due(self) -> None:
        """Reap the workers whose timers expired (torch's algorithm, for custom servers)."""
        reaped = set()
        for worker_id, timers in self.get_expired_timers(self._clock.wall()).items():
            log.info("Reaping worker_id=[%s]. Expired timers: %s", worker_id,
                     [t.scope_id for t in timers])
            if self._reap_worker(worker_id):
                reaped.add(worker_id)
        self.clear_timers(reaped)

    def _housekeeping(self) -> None:
        """Periodic upkeep, at most every ``max_interval``."""

    def _wake(self) -> None:
        """Interrupt ``_receive`` (stop, clock jumps)."""

    _restartable = True  # False where ``_close`` releases what ``start`` cannot re-create

    def _close(self) -> None:
        """Release what the server holds (files, fds); called once by ``stop``."""

    def _on_started(self) -> None: ...

    def _on_stopped(self) -> None: ...

    def _on_watchdog_failed(self, error: BaseException) -> None: ...

    # ---- the loop ---------------------------------------------------------------------

    def _wait_timeout(self) -> float | None:
        nxt = self._next_wakeup()
        delay = self._max_interval
        if nxt is not None:
            delay = min(delay, nxt - self._clock.now())
        return self._clock.wait_timeout(delay)

    def _run_watchdog(self) -> None:
        requests = self._receive(self._wait_timeout())
        if requests:
            # What arrived since is read too, without waiting, before anything expires: a
            # worker's release already sent must count even when this thread was slow to
            # read it (a late read of an acquire and the release after it would otherwise
            # kill a worker that released in time).
            self.register_timers(requests + self._receive(0.0))
        self._expire_due()
        self._housekeeping()

    def _watchdog_loop(self) -> None:
        try:
            while not self._stop_event.is_set():
                self._run_watchdog()
        except BaseException as e:  # recorded and reported, never swallowed silently
            if self._stop_event.is_set():  # resources closed under us while stopping
                log.debug("%s watchdog ended while stopping: %r", type(self).__name__, e)
                return
            self.error = e
            log.error("%s watchdog thread died: timers no longer expire", type(self).__name__,
                      exc_info=True)
            self._on_watchdog_failed(e)

    # ---- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog thread (non-blocking).

        As torch's: starting a running server is accepted (torch starts a second thread
        that shares the first one's stop flag; one thread does the same work, so ours
        keeps one), and a stopped server may be started again unless ``stop`` released
        what it cannot re-create (``_restartable = False``)."""
        if self.is_alive():
            log.info("%s is already running; start() does nothing", type(self).__name__)
            return
        if self._stopped and self._restartable:
            self._stopped, self._thread = False, None
            self._stop_event.clear()
        if self._thread is not None or self._stopped:
            raise RuntimeError(f"{type(self).__name__} cannot be started again: "
                               + ("stop() released its resources" if self._stopped
                                  else "its watchdog thread died"))
        log.info("Starting %s: max_interval=%s, daemon=%s", type(self).__name__,
                 self._max_interval, self._daemon)
        self._unsubscribe = self._clock.subscribe(self._wake)
        self._thread = threading.Thread(target=self._watchdog_loop, daemon=self._daemon,
                                        name=f"{type(self).__name__}-watchdog")
        self._thread.start()
        self._on_started()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (promptly: it is woken, not waited out) and release resources.

        Idempotent. ``timeout`` bounds the join; a thread still running after it is
        reported with a warning.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        thread = self._thread
        if thread is not None:
            self._wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s watchdog thread still running %.1fs after stop(); "
                            "it is %sa daemon thread", type(self).__name__, timeout,
                            "" if thread.daemon else "not ")
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._close()
        self._on_stopped()

    def is_alive(self) -> bool:
        """True while the watchdog thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self: _S) -> _S:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = ("failed" if self.error is not None else "running" if self.is_alive()
                 else "stopped" if self._stopped else "new")
        return f"<{type(self).__name__} {state} max_interval={self._max_interval}>"


# ----------------------------------------------------------------------------------------
# the client side: configure / expires

_timer_client: Any = None
_active_lock = threading.Lock()
_active_scopes: set[tuple[int, str]] = set()


def configure(timer_client: TimerClient | None) -> None:
    """Set the process-wide client ``expires`` uses. Must be called before ``expires``;
    ``None`` unsets it (``expires`` then raises RuntimeError, as torch's).

    Any object with ``acquire(scope_id, expiration_time)`` and ``release(scope_id)`` is
    accepted (torch's clients too).
    """
    global _timer_client
    if timer_client is not None and not (callable(getattr(timer_client, "acquire", None))
            and callable(getattr(timer_client, "release", None))):
        raise ConfigError("timer_client", timer_client, "must have acquire() and release() methods")
    _timer_client = timer_client
    log.info("Timer client configured to: %s", type(timer_client).__name__)


def _claim_scope(client: Any, scope: str) -> str:
    """A scope id no other active ``expires`` of this client uses: a recursive call or a
    second thread on the same line gets ``scope~2`` instead of overwriting the first timer."""
    with _active_lock:
        candidate, n = scope, 1
        while (id(client), candidate) in _active_scopes:
            n += 1
            candidate = f"{scope}~{n}"
        _active_scopes.add((id(client), candidate))
        return candidate


def _unclaim_scope(client: Any, scope: str) -> None:
    with _active_lock:
        _active_scopes.discard((id(client), scope))


class _Expires(contextlib.ContextDecorator):
    """The object ``expires`` returns: a context manager, and a decorator that takes a
    fresh timer for every call."""

    def __init__(self, after: float, scope: str, client: Any):
        self._after = after
        self._scope = scope
        self._client = client
        self._active: list[tuple[Any, str]] = []

    def _recreate_cm(self) -> _Expires:
        return _Expires(self._after, self._scope, self._client)

    def __enter__(self) -> None:
        client = self._client if self._client is not None else _timer_client
        if client is None:
            raise RuntimeError("Configure timer client before using countdown timers "
                               "(call harness.timer.configure(client) first).")
        scope = _claim_scope(client, self._scope)
        try:
            client.acquire(scope, time.time() + self._after)
        except BaseException:
            _unclaim_scope(client, scope)
            raise
        self._active.append((client, scope))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        client, scope = self._active.pop()
        try:
            client.release(scope)
        except Exception:
            if exc_type is None:
                raise
            # keep the body's exception; the lost release only matters if we survive it
            log.warning("could not release timer scope=%r while handling %s", scope,
                        exc_type.__name__, exc_info=True)
        finally:
            _unclaim_scope(client, scope)
        return False

    def __repr__(self) -> str:
        return f"expires(after={self._after!r}, scope={self._scope!r})"


def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> _Expires:
    """A countdown timer: the worker becomes eligible to be reaped ``after`` seconds after
    the block (or decorated call) starts, unless it finishes first.

    Use as ``with expires(after=60): ...`` or as ``@expires(after=60)``. ``scope``
    defaults to ``"<caller file>#<line>"``; the timer is released on exit, exceptions
    included. The client is looked up when the block starts (``configure`` first, else
    RuntimeError), so a decorator may be applied before ``configure`` runs.
    """
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not (
        math.isfinite(after) and after >= 0
    ):
        raise ConfigError("after", after, "must be a finite number of seconds >= 0")
    if scope is None:
        caller = sys._getframe(1)
        scope = f"{caller.f_code.co_filename}#{caller.f_lineno}"
    elif not isinstance(scope, str):
        raise ConfigError("scope", scope, "must be a string")
    return _Expires(float(after), scope, client)
