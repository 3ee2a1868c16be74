"""Timers over a multiprocessing queue: ``LocalTimerServer`` / ``LocalTimerClient``.

Wire-compatible with torch's pair: the client puts a pickled request object with
``worker_id`` (the pid), ``scope_id`` and wall-clock ``expiration_time`` (-1: release);
the server accepts torch's ``TimerRequest`` objects as well as ours. Unlike torch's, the
server wakes at the nearest deadline (torch: after up to ``max_interval``, 60 s by
default) and ``stop()`` returns at once (torch: joins for ``max_interval``).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue as _queue
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.timer._api import TimerClient, TimerExpiry, TimerRequest
from harness.timer._clock import Clock
from harness.timer._engine import HeapTimerServer

__all__ = ["LocalTimerServer", "LocalTimerClient"]

log = logging.getLogger(__name__)

_WAKE = "harness.timer:wake"  # put on the queue by the server itself to end a wait early
_BATCH = 1024  # requests taken per wake-up, so a flood cannot delay expiry indefinitely
# what unpickling a foreign or damaged object can raise: such an item is skipped
_UNPICKLE_ERRORS = (pickle.UnpicklingError, AttributeError, ImportError, EOFError, TypeError,
                    ValueError, IndexError, KeyError)


class LocalTimerClient(TimerClient):
    """Client of ``LocalTimerServer``; identifies its worker by pid. Thread-safe."""

    def __init__(self, mp_queue: Any):
        self._mp_queue = mp_queue

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._mp_queue.put(TimerRequest(os.getpid(), scope_id, expiration_time))

    def release(self, scope_id: str) -> None:
        self._mp_queue.put(TimerRequest(os.getpid(), scope_id, -1))


class LocalTimerServer(HeapTimerServer):
    """Server for ``LocalTimerClient``s running in processes started below this one.

    Reaps with SIGKILL. Requests are honoured for descendants of this process, or, once
    ``set_workers`` was called, only for the listed workers. ``max_interval`` bounds a
    single wait (housekeeping); it does not delay expiry.

    A property of ``multiprocessing.Queue`` that no server can fix (torch's pair has it
    too): a client process that dies while its feeder thread holds the queue's shared
    write lock leaves the queue wedged for every other client. The FIFO pair has no
    such lock, which is why the agent's watchdog uses it.
    """

    def __init__(self, mp_queue: Any, max_interval: float = 60, daemon: bool = True, *,
                 clock: Clock | None = None,
                 workers: Mapping[int, int | None] | Iterable[int] | None = None,
                 on_expired: Callable[[TimerExpiry], None] | None = None,
                 log_event: Callable[[str, Any], None] | None = None):
        super().__init__(max_interval, daemon, clock=clock, workers=workers,
                         on_expired=on_expired, log_event=log_event)
        self._mp_queue = mp_queue

    def _receive(self, timeout: float | None) -> list[Any]:
        q = self._mp_queue
        items: list[Any] = []
        try:
            if timeout is None:
                items.append(q.get())
            elif timeout <= 0:
                items.append(q.get(block=False))
            else:
                items.append(q.get(timeout=timeout))
        except _queue.Empty:
            return []
        except _UNPICKLE_ERRORS as e:
            self._undecodable(e)
        for _ in range(_BATCH):
            try:
                items.append(q.get(block=False))
            except _queue.Empty:
                break
            except _UNPICKLE_ERRORS as e:
                self._undecodable(e)
        return [item for item in items if not (isinstance(item, str) and item == _WAKE)]

    def _undecodable(self, error: Exception) -> None:
        self.rejected += 1
        log.warning("LocalTimerServer skipped a queue item it could not unpickle: %r", error)

    def _wake(self) -> None:
        try:
            self._mp_queue.put(_WAKE)
        except (ValueError, OSError, AssertionError):  # queue closed by its owner
            pass
