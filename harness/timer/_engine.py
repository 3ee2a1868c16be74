"""The timer table shared by our servers: a heap of monotonic deadlines plus worker identity.

Why a heap: the watchdog sleeps exactly until the nearest deadline (torch checks only
after a ``max_interval`` wait, so a timer fires up to ``max_interval`` late). Why
identities: a timer is bound to (pid, start time), so a timer left behind by a worker
that died can never fire on a process that reused its pid; and, once the server is
told its workers (``set_workers``), requests naming any other process are ignored.
Until then only descendants of the server's process are accepted: the server never
signals a process it could not have started, nor itself or its parent.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import os
import signal as _signal
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.errors import ConfigError
from harness.timer._api import TimerExpiry, TimerServer
from harness.timer._clock import Clock
from harness.timer._debug import log_debug_info_for_expired_timers
from harness.timer._proc import (
    ALLOWED_SIGNALS,
    is_descendant,
    is_protected,
    signal_if_same,
    start_time,
)

__all__ = ["HeapTimerServer", "MAX_SCOPE_CHARS", "MAX_TIMERS_PER_WORKER"]

log = logging.getLogger(__name__)

MAX_SCOPE_CHARS = 4096
MAX_TIMERS_PER_WORKER = 4096
MAX_PENDING = 1024  # requests held for pids not (yet) registered as workers
PENDING_TTL = 10.0  # seconds a request waits for its pid to be registered
RETRY_DELAY = 1.0  # seconds before retrying a reap that failed (bounded by max_interval)
_REAPS_REMEMBERED = 256  # recent reaps kept for ``reaped()``
_LOUD_REJECTIONS = 20  # warnings before rejections are logged at debug level only

LogEvent = Callable[[str, Any], None]


def _finite(number: float) -> bool:
    """math.isfinite, False too for an int past float's range (10**400 on the wire: isfinite
    raised OverflowError and the watchdog died of it)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


class BadRequest(ValueError):
    """A request that cannot be honoured; the message says why."""


def _signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return str(sig)


_ALLOWED_NAMES = ", ".join(sorted(_signal_name(s) for s in ALLOWED_SIGNALS))


class _Timer:
    __slots__ = ("pid", "scope_id", "deadline", "signal", "request", "seq")

    def __init__(self, pid: int, scope_id: str, deadline: float, signal: int, request: Any,
                 seq: int):
        self.pid, self.scope_id, self.deadline = pid, scope_id, deadline
        self.signal, self.request, self.seq = signal, request, seq


class _Pending:
    __slots__ = ("pid", "start", "scope_id", "deadline", "signal", "request", "received")

    def __init__(self, pid: int, start: int, scope_id: str, deadline: float, signal: int, request: Any,
                 received: float):
        self.pid, self.start, self.scope_id, self.deadline = pid, start, scope_id, deadline
        self.signal, self.request, self.received = signal, request, received


class HeapTimerServer(TimerServer):
    """Base of ``LocalTimerServer`` and ``FileTimerServer``: everything but the transport.

    Subclasses provide ``_receive`` and ``_wake``. Thread-safe: ``register_timers``,
    ``set_workers`` and friends may be called from any thread while the watchdog runs.
    """

    _default_signal = int(_signal.SIGKILL)

    def __init__(self, max_interval: float, daemon: bool, *, clock: Clock | None,
                 run_id: str = "", workers: Mapping[int, int | None] | Iterable[int] | None = None,
                 on_expired: Callable[[TimerExpiry], None] | None = None,
                 log_event: LogEvent | None = None):
        super().__init__(None, max_interval, daemon, clock=clock)
        self._run_id = run_id
        self._on_expired = on_expired
        self._log_event = log_event
        self._lock = threading.RLock()
        self._by_worker: dict[int, dict[str, _Timer]] = {}
        self._heap: list[tuple[float, int, int, str]] = []
        self._seq = itertools.count()
        self._identity: dict[int, int] = {}  # pid -> start time, for every pid we accepted
        self._allowed: dict[int, int] | None = None
        self._pending: list[_Pending] = []
        # pid -> what the watchdog did to it, written under the lock as the signal is sent:
        # the agent may see the worker die before ``on_expired`` runs and asks here.
        self._reaped: dict[int, TimerExpiry] = {}
        self._next_housekeeping = self._clock.now() + self._max_interval
        self.rejected = 0  # requests refused or malformed (for tests and diagnostics)
        if workers is not None:  # no set_workers(): the transport is not set up yet
            self._allowed = self._resolve(workers)

    # ---- worker allow-list ------------------------------------------------------------

    def set_workers(self, workers: Mapping[int, int | None] | Iterable[int] | None) -> None:
        """Honour requests only from these processes: ``{pid: start_time}`` (a start
        time of None is read from /proc now) or an iterable of pids. Timers of processes
        no longer listed are dropped. ``None`` returns to the default: descendants of
        this process."""
        resolved = None if workers is None else self._resolve(workers)
        with self._lock:
            self._allowed = resolved
            for pid in list(self._by_worker):
                if resolved is not None and resolved.get(pid) != self._identity.get(pid):
                    self._drop_worker(pid)
            if resolved is not None:
                self._identity = {p: s for p, s in self._identity.items() if resolved.get(p) == s}
                for pid in resolved:  # a listed pid is a new process: forget an old reap
                    self._reaped.pop(pid, None)
            events = self._admit_pending()
        self._dispatch(events)
        self._wake_loop()

    def add_worker(self, pid: int, start: int | None = None) -> None:
        """Allow one more worker (switches to allow-list mode if not already)."""
        resolved = self._resolve({pid: start})
        with self._lock:
            self._allowed = {**(self._allowed or {}), **resolved}
            events = self._admit_pending()
        self._dispatch(events)
        self._wake_loop()

    def remove_worker(self, pid: int) -> None:
        """Drop ``pid``'s timers and its place in the allow-list (in descendants-only mode
        its next request admits it again)."""
        with self._lock:
            if self._allowed is not None:
                self._allowed.pop(pid, None)
            self._identity.pop(pid, None)
            self._drop_worker(pid)

    @property
    def workers(self) -> dict[int, int] | None:
        """The allow-list ``{pid: start_time}``, None in descendants-only mode."""
        with self._lock:
            return None if self._allowed is None else dict(self._allowed)

    @staticmethod
    def _resolve(workers: Mapping[int, int | None] | Iterable[int]) -> dict[int, int]:
        items = workers.items() if isinstance(workers, Mapping) else ((p, None) for p in workers)
        resolved: dict[int, int] = {}
        for pid, start in items:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                raise ConfigError("pid", pid, "must be a process id (int > 0)", "set_workers")
            if start is None:
                start = start_time(pid)
                if start is None:
                    log.info("worker pid=%d is already gone; not registered", pid)
                    continue
            resolved[pid] = int(start)
        return resolved

    # ---- TimerServer API --------------------------------------------------------------

    def register_timers(self, timer_requests: list[Any]) -> None:
        now, wall = self._clock.now(), self._clock.wall()
        events: list[tuple[Any, ...]] = []
        with self._lock:
            for request in timer_requests:
                try:
                    pid, scope_id, expiration, sig = self._unpack(request)
                except BadRequest as e:
                    self._reject(request, str(e), events)
                    continue
                if expiration < 0:
                    self._release(pid, scope_id)
                else:
                    # wire deadlines are wall clock; from here on only the monotonic one counts
                    self._acquire(pid, scope_id, now + (expiration - wall), sig, request, now, events)
            self._maybe_compact()
        self._dispatch(events)
        self._wake_loop()  # a caller other than the loop may have added an earlier deadline

    def clear_timers(self, worker_ids: Iterable[Any]) -> None:
        with self._lock:
            for pid in set(worker_ids):
                self._drop_worker(pid)
            self._maybe_compact()

    def get_expired_timers(self, deadline: float) -> dict[int, list[Any]]:
        """Timers due by wall-clock ``deadline`` (converted to the monotonic timeline now),
        per pid, earliest first, as the requests were received."""
        with self._lock:
            limit = self._clock.now() + (deadline - self._clock.wall())
            expired: dict[int, list[Any]] = {}
            for pid, timers in self._by_worker.items():
                due = sorted((t for t in timers.values() if t.deadline <= limit),
                             key=lambda t: t.deadline)
                if due:
                    expired[pid] = [t.request for t in due]
            return expired

    def _reap_worker(self, worker_id: int, sig: int = _signal.SIGKILL) -> bool:
        """Signal the worker if it is still the process that acquired the timer.
        True when done (signalled or already gone), False to retry later."""
        expected = self._identity.get(worker_id)
        if expected is None:
            return True
        try:
            sent = signal_if_same(worker_id, expected, sig)
        except OSError as e:
            log.error("could not send %s to worker pid=%d: %s; retrying", _signal_name(sig),
                      worker_id, e)
            return False
        if not sent:
            log.info("worker pid=%d was gone before it could be reaped", worker_id)
        return True

    @property
    def timer_count(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._by_worker.values())

    # ---- request handling (lock held) -----------------------------------------------

    def _unpack(self, request: Any) -> tuple[int, str, float, int]:
        """(pid, scope_id, expiration_time, signal) of a request object, validated."""
        try:
            pid = request.worker_id
            scope_id = request.scope_id
            expiration = request.expiration_time
        except AttributeError:
            raise BadRequest(f"not a timer request: {type(request).__name__}") from None
        sig = getattr(request, "signal", self._default_signal)
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise BadRequest(f"worker_id={pid!r} must be a pid (int > 0)")
        if not isinstance(scope_id, str) or len(scope_id) > MAX_SCOPE_CHARS:
            raise BadRequest(f"scope_id must be a string of at most {MAX_SCOPE_CHARS} characters")
        if isinstance(expiration, bool) or not isinstance(expiration, (int, float)) or not _finite(expiration):
            raise BadRequest(f"expiration_time={expiration!r:.40} must be a finite number")
        if isinstance(sig, bool) or not isinstance(sig, int):
            raise BadRequest(f"signal={sig!r} must be an int")
        if expiration >= 0 and sig > 0 and sig not in ALLOWED_SIGNALS:
            raise BadRequest(f"signal={sig} is not allowed (allowed: {_ALLOWED_NAMES}; "
                             "<= 0 means expire without a signal)")
        return pid, scope_id, float(expiration), int(sig)

    def _acquire(self, pid: int, scope_id: str, deadline: float, sig: int, request: Any,
                 now: float, events: list[Any]) -> None:
        if is_protected(pid):
            self._reject(request, f"pid={pid} is this server, its parent or not a process", events)
            return
        known = self._identity.get(pid)
        if known is not None and (self._allowed is None or self._allowed.get(pid) == known):
            # a worker we already verified: skip /proc. Were the pid reused meanwhile, the
            # start time checked again at expiry would drop the timer, never signal it
            self._insert(pid, scope_id, deadline, sig, request, events)
            return
        current = start_time(pid)
        if current is None:
            self._reject(request, f"pid={pid} does not exist", events)
            return
        if self._allowed is not None:
            expected = self._allowed.get(pid)
            if expected is None:
                # the agent may not have registered a just-started worker yet: hold it briefly
                self._pend(_Pending(pid, current, scope_id, deadline, sig, request, now), events)
                return
            if expected != current:
                self._reject(request, f"pid={pid} is not the registered worker (pid reused)", events)
                return
        elif self._identity.get(pid) != current:
            if not is_descendant(pid, os.getpid()):
                self._reject(request, f"pid={pid} is not a descendant of the timer server "
                                      f"(pid {os.getpid()}); register workers with set_workers()",
                             events)
                return
        self._identity[pid] = current
        self._insert(pid, scope_id, deadline, sig, request, events)

    def _insert(self, pid: int, scope_id: str, deadline: float, sig: int, request: Any,
                events: list[Any]) -> None:
        timers = self._by_worker.setdefault(pid, {})
        if scope_id not in timers and len(timers) >= MAX_TIMERS_PER_WORKER:
            self._reject(request, f"pid={pid} already holds {MAX_TIMERS_PER_WORKER} timers", events)
            return
        timer = _Timer(pid, scope_id, deadline, sig, request, next(self._seq))
        timers[scope_id] = timer
        heapq.heappush(self._heap, (deadline, timer.seq, pid, scope_id))

    def _release(self, pid: int, scope_id: str) -> None:
        timers = self._by_worker.get(pid)
        if timers is not None and timers.pop(scope_id, None) is not None:
            if not timers:
                del self._by_worker[pid]
            return
        for i, p in enumerate(self._pending):  # release of a request still held back
            if p.pid == pid and p.scope_id == scope_id:
                del self._pending[i]
                return

    def _pend(self, item: _Pending, events: list[Any]) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._reject(item.request, f"pid={item.pid} is not a registered worker "
                                       f"(and {MAX_PENDING} requests are already held)", events)
            return
        log.debug("holding a request from pid=%d until it is registered as a worker", item.pid)
        self._pending.append(item)

    def _admit_pending(self) -> list[Any]:
        """Apply held requests whose pid is now a registered worker; expire old ones."""
        events: list[Any] = []
        if not self._pending:
            return events
        now = self._clock.now()
        keep: list[_Pending] = []
        for p in self._pending:
            allowed = None if self._allowed is None else self._allowed.get(p.pid)
            if self._allowed is None or allowed == p.start:
                if self._allowed is None and not is_descendant(p.pid, os.getpid()):
                    self._reject(p.request, f"pid={p.pid} is not a descendant of the timer server",
                                 events)
                    continue
                self._identity[p.pid] = p.start
                self._insert(p.pid, p.scope_id, p.deadline, p.signal, p.request, events)
            elif now - p.received > PENDING_TTL or allowed is not None:
                self._reject(p.request, f"pid={p.pid} is not a registered worker of this server",
                             events)
            else:
                keep.append(p)
        self._pending = keep
        return events

    def _reject(self, request: Any, reason: str, events: list[Any]) -> None:
        self.rejected += 1
        level = logging.WARNING if self.rejected <= _LOUD_REJECTIONS else logging.DEBUG
        log.log(level, "%s ignored a timer request: %s (request: %.200r)", type(self).__name__,
                reason, request)
        events.append(("event", "request rejected", request))

    def _drop_worker(self, pid: int) -> None:
        self._by_worker.pop(pid, None)

    def _maybe_compact(self) -> None:
        live = sum(len(t) for t in self._by_worker.values())
        if len(self._heap) > 2 * live + 64:  # releases leave stale heap entries behind
            self._heap = [(t.deadline, t.seq, t.pid, t.scope_id)
                          for timers in self._by_worker.values() for t in timers.values()]
            heapq.heapify(self._heap)

    def _current(self, entry: tuple[float, int, int, str]) -> _Timer | None:
        _, seq, pid, scope_id = entry
        timer = self._by_worker.get(pid, {}).get(scope_id)
        return timer if timer is not None and timer.seq == seq else None

    # ---- the watchdog's side ----------------------------------------------------------

    def _nearest_deadline(self) -> float | None:
        """The earliest deadline of a live timer (stale heap entries dropped on the way)."""
        with self._lock:
            while self._heap and self._current(self._heap[0]) is None:
                heapq.heappop(self._heap)
            return self._heap[0][0] if self._heap else None

    def _next_wakeup(self) -> float | None:
        nearest = self._nearest_deadline()
        if nearest is None:
            return self._next_housekeeping
        return min(nearest, self._next_housekeeping)

    def _expire_due(self) -> None:
        now = self._clock.now()
        nearest = self._nearest_deadline()
        if nearest is not None and nearest <= now:
            # Requests already sent are read first, without waiting: a release sent before
            # the deadline must count even when this thread read its acquire, lost the CPU
            # and came back past the deadline (seen under load: a worker killed for a scope
            # it had released). One sent after this read was sent after ``now``: late.
            waiting = self._receive(0.0)
            if waiting:
                self.register_timers(waiting)
        events: list[Any] = []
        with self._lock:
            due: dict[int, list[_Timer]] = {}
            while self._heap and self._heap[0][0] <= now:
                timer = self._current(heapq.heappop(self._heap))
                if timer is not None:
                    due.setdefault(timer.pid, []).append(timer)
            for pid, timers in due.items():
                self._expire_worker(pid, timers, now, events)
        self._dispatch(events)

    def _expire_worker(self, pid: int, timers: list[_Timer], now: float, events: list[Any]) -> None:
        timers.sort(key=lambda t: t.deadline)
        scopes = tuple(t.scope_id for t in timers)
        expected = self._identity.get(pid)
        if expected is None or start_time(pid) != expected:
            log.info("worker pid=%d exited before its timers %s expired; dropping them", pid, scopes)
            self._drop_worker(pid)
            return
        log_debug_info_for_expired_timers(self._run_id, {pid: [_to_json(t) for t in timers]})
        for t in timers:
            events.append(("event", "timer expired", t.request))
        chosen = next((t for t in timers if t.signal > 0), None)
        lateness = now - timers[0].deadline
        if chosen is None:
            log.info("timers %s of worker pid=%d expired; no signal was asked for", scopes, pid)
            worker_timers = self._by_worker.get(pid, {})
            for t in timers:
                if worker_timers.get(t.scope_id) is t:
                    del worker_timers[t.scope_id]
            if not worker_timers:
                self._by_worker.pop(pid, None)
            events.append(("expiry", TimerExpiry(pid, scopes, 0, False, lateness)))
            return
        log.info("Reaping worker pid=%d with %s: expired timers %s", pid,
                 _signal_name(chosen.signal), scopes)
        if self._reap_worker(pid, chosen.signal):
            self._drop_worker(pid)
            expiry = TimerExpiry(pid, scopes, chosen.signal, True, lateness)
            self._remember_reap(expiry)
            events.append(("event", "kill worker process", chosen.request))
            events.append(("expiry", expiry))
            return
        retry = now + min(RETRY_DELAY, self._max_interval)
        for t in timers:
            t.deadline, t.seq = retry, next(self._seq)
            heapq.heappush(self._heap, (retry, t.seq, pid, t.scope_id))

    def _remember_reap(self, expiry: TimerExpiry) -> None:
        self._reaped.pop(expiry.worker_id, None)
        self._reaped[expiry.worker_id] = expiry
        while len(self._reaped) > _REAPS_REMEMBERED:
            del self._reaped[next(iter(self._reaped))]

    def reaped(self, pid: int) -> TimerExpiry | None:
        """What the watchdog did to ``pid`` if it signalled it, even before ``on_expired``
        ran: the signal is sent under the lock this takes, so a caller that saw the
        worker die of it always finds the record."""
        with self._lock:
            return self._reaped.get(pid)

    def _housekeeping(self) -> None:
        now = self._clock.now()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + self._max_interval
        with self._lock:
            for pid in list(self._identity):
                if start_time(pid) != self._identity[pid]:
                    del self._identity[pid]
                    if self._by_worker.pop(pid, None):
                        log.debug("dropped the timers of exited worker pid=%d", pid)
            events = self._admit_pending()
            self._maybe_compact()
        self._dispatch(events)

    def _dispatch(self, events: list[Any]) -> None:
        """Run user callbacks outside the lock; a failing callback never stops the server."""
        for kind, *payload in events:
            callback = self._on_expired if kind == "expiry" else self._log_event
            if callback is None:
                continue
            try:
                callback(*payload)
            except Exception:
                log.exception("%s callback raised; continuing", "on_expired" if kind == "expiry"
                              else "log_event")

    def _wake_loop(self) -> None:
        """Wake the watchdog so it recomputes its deadline; not needed from the loop itself."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._wake()

    def _emit(self, name: str, request: Any = None) -> None:
        self._dispatch([("event", name, request)])

    def _on_started(self) -> None:
        self._emit("watchdog started")

    def _on_stopped(self) -> None:
        self._emit("watchdog stopped")

    def _on_watchdog_failed(self, error: BaseException) -> None:
        self._emit("watchdog failed")


def _to_json(timer: _Timer) -> str:
    to_json = getattr(timer.request, "to_json", None)
    if callable(to_json):
        text: str = to_json()
        return text
    return json.dumps({"version": 1, "pid": timer.pid, "scope_id": timer.scope_id,
                       "expiration_time": getattr(timer.request, "expiration_time", None),
                       "signal": timer.signal})
