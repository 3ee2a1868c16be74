"""Clocks for timer servers: the real monotonic one and a fake one for tests.

A server keeps every deadline on ``clock.now()`` (monotonic: NTP steps and manual clock
changes cannot move a deadline). Clients speak wall-clock time on the wire (torch's
format: ``time.time() + after``); ``clock.wall()`` is read once per received request to
convert it. ``wait_timeout`` turns "sleep until this clock has advanced by d" into a real
timeout for the server's blocking wait, and ``subscribe`` lets a clock wake the server
when its time jumps, so a fake clock drives a real server thread without real sleeps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "FakeClock"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; only differences are meaningful."""

    def wall(self) -> float:
        """Wall-clock seconds since the epoch (``time.time()``), for wire conversion only."""

    def wait_timeout(self, delay: float) -> float | None:
        """Real seconds to block for ``delay`` seconds of this clock (None: until woken)."""

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever time jumps; returns a function that unsubscribes."""


class MonotonicClock:
    """The real clock: ``time.monotonic`` for deadlines, ``time.time`` for the wire."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait_timeout(self, delay: float) -> float | None:
        return max(0.0, delay)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        return _noop

    def __repr__(self) -> str:
        return "MonotonicClock()"


def _noop() -> None:
    return None


class FakeClock:
    """A clock that moves only when told to (as trio's MockClock).

    ``advance(dt)`` moves both the monotonic and the wall reading; ``step_wall(dt)``
    moves only the wall reading, as an NTP step would. Servers block until woken
    (``wait_timeout`` is None for any future delay), and every change wakes them.
    """

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0):
        self._now = float(start)
        self._wall_offset = float(wall_offset)
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[], None]] = []

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall_offset + self._now

    def wait_timeout(self, delay: float) -> float | None:
        return 0.0 if delay <= 0 else None

    def advance(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds={seconds!r} must be a finite number >= 0")
        with self._lock:
            self._now += seconds
        self._notify()

    def step_wall(self, seconds: float) -> None:
        """Jump the wall clock only (either way); deadlines already received must not move."""
        with self._lock:
            self._wall_offset += seconds
        self._notify()

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(wake)

        def unsubscribe() -> None:
            with self._lock:
                if wake in self._subscribers:
                    self._subscribers.remove(wake)

        return unsubscribe

    def _notify(self) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for wake in subscribers:
            wake()

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now!r})"
