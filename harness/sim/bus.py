"""A job's event bus: one reader thread feeds the ``Timeline`` and wakes every waiter.

Writers (agents, workers' ``report_step``, the harness) append a line to the events file
and poke a Unix datagram socket at a filesystem path (``$HARNESS_EVENTS_WAKE``; a path, not
an abstract name, so it works across network namespaces). The reader blocks on that
socket, a stop pipe and one pidfd per watched process (the node agents), and on each wake
reads the new lines into the timeline. Whoever reads new lines (the reader, or a query
that refreshed first) bumps ``generation`` and notifies the condition variable that
waiters on events (``wait_until``, the fault scheduler) block on. A watched process's exit
(and ``notify(lifecycle=True)``: a fault failure, a frozen node) also bumps ``lifecycle``,
which waiters that only care about exits (``Job.wait``) block on, so a training job's
stream of step events does not wake them. The reader listens to the socket only while
someone waits on events (``listening()``: ``wait_until``, the fault scheduler while it
has pending faults): with
nobody to wake, a datagram costs the harness nothing (the socket's queue fills up, and
the writers' non-blocking sends fail silently) and the reader sleeps until an exit or a
new listener; queries still read every line written before them.

The file is the truth: a lost datagram delays an event by at most ``SAFETY_S`` (the
reader re-reads the file that often anyway), it never loses one.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from harness.selfpipe import drain_pipe, self_pipe, wake_pipe
from harness.sim.leftovers import remove_dead_owners
from harness.sim.truth.timeline import Timeline

__all__ = ["EventBus", "SAFETY_S"]

#: the longest a lost wake-up can delay an event (the reader's periodic re-read)
SAFETY_S = 0.5
_MAX_UNIX_PATH = 107
_WAKE_PREFIX = "elastic_wake_"  # + the harness pid: what a killed harness left, the next removes


class EventBus:
    """Feeds ``timeline`` from ``directory``/wake.sock pokes; ``close()`` ends it.
    ``safety``: the period of the re-read that covers lost wake-ups."""

    def __init__(self, timeline: Timeline, directory: str, safety: float = SAFETY_S):
        self.timeline = timeline
        self._safety = safety
        self._own_dir: str | None = None
        path = os.path.join(directory, "wake.sock")
        remove_dead_owners(_WAKE_PREFIX, "/tmp")
        if len(path.encode()) > _MAX_UNIX_PATH:  # a deep TMPDIR: bind somewhere short instead
            self._own_dir = tempfile.mkdtemp(prefix=f"{_WAKE_PREFIX}{os.getpid()}_", dir="/tmp")
            path = os.path.join(self._own_dir, "wake.sock")
        self.wake_path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.bind(path)
        self._sock.setblocking(False)
        self._poke_r, self._poke_w = self_pipe()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._poke_r, selectors.EVENT_READ)
        self._listening = False  # is the socket in the selector (someone waits on events)
        self._subscribers = 0
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # every change
        self._life_cond = threading.Condition(lock)  # exits and failures only
        self._generation = 0
        self._lifecycle = 0
        self._closed = False
        self._lock = threading.Lock()  # guards the watch lists below
        self._new_watches: list[tuple[int, Callable[[], None]]] = []
        self._pidfds: dict[int, tuple[int, Callable[[], None]]] = {}  # pidfd -> (pid, on_exit)
        self._polled: dict[int, Callable[[], None]] = {}  # pid -> on_exit (no pidfd support)
        timeline.add_listener(self.notify)
        self._thread = threading.Thread(target=self._run, name=f"events-{os.path.basename(directory)}",
                                        daemon=True)
        self._thread.start()

    # -- waiting -------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Bumped whenever something happened (new events, a watched exit, a poke)."""
        return self._generation

    def notify(self, lifecycle: bool = False) -> None:
        """Wake the waiters on events; ``lifecycle``: those waiting for exits too."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            if lifecycle:
                self._lifecycle += 1
                self._life_cond.notify_all()

    def _counter(self, lifecycle: bool) -> int:
        return self._lifecycle if lifecycle else self._generation

    def wait_change(self, since: int, timeout: float, lifecycle: bool = False) -> int:
        """Block until the counter (``generation``, or ``lifecycle``) differs from ``since``
        (or ``timeout``); its new value."""
        deadline = time.monotonic() + timeout
        cond = self._life_cond if lifecycle else self._cond
        with cond:
            while self._counter(lifecycle) == since and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                cond.wait(min(remaining, self._safety))
            return self._counter(lifecycle)

    def subscribe(self) -> None:
        """From now on (until ``unsubscribe``) the reader wakes on every datagram."""
        with self._cond:
            self._subscribers += 1
            first = self._subscribers == 1
        if first:
            self._poke()  # the reader starts listening to the socket now

    def unsubscribe(self) -> None:
        with self._cond:
            self._subscribers -= 1

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """While inside, the reader wakes on every datagram (waiters on events use it)."""
        self.subscribe()
        try:
            yield
        finally:
            self.unsubscribe()

    def wait_until(self, predicate: Callable[[], bool], timeout: float, lifecycle: bool = False) -> bool:
        """Block until ``predicate()`` holds, re-checked on every change (``lifecycle``:
        only on exits and failures, for a predicate that depends on nothing else; the
        safety period bounds the wait either way); False on timeout."""
        if lifecycle:
            return self._wait_until(predicate, timeout, True)
        with self.listening():
            return self._wait_until(predicate, timeout, False)

    def _wait_until(self, predicate: Callable[[], bool], timeout: float, lifecycle: bool) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            seen = self._counter(lifecycle)  # before the check: a change during it is not missed
            if predicate():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._closed:  # nothing will change any more: one last look
                return predicate()
            self.wait_change(seen, min(remaining, self._safety), lifecycle)

    # -- watching processes --------------------------------------------------------------

    def watch(self, pid: int, on_exit: Callable[[], None]) -> None:
        """Call ``on_exit()`` on the reader thread once process ``pid`` (a child of this
        process, not yet reaped) has exited, then wake the waiters."""
        with self._lock:
            self._new_watches.append((pid, on_exit))
        self._poke()

    def _poke(self) -> None:
        wake_pipe(self._poke_w)  # a full pipe: the reader is awake anyway

    def _take_watches(self) -> None:
        with self._lock:
            watches, self._new_watches = self._new_watches, []
        for pid, on_exit in watches:
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # gone already, or no pidfd on this kernel
                self._polled[pid] = on_exit
                continue
            self._pidfds[fd] = (pid, on_exit)
            self._selector.register(fd, selectors.EVENT_READ)

    def _check_polled(self) -> bool:
        fired = False
        for pid, on_exit in list(self._polled.items()):
            info: os.waitid_result | bool | None
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = True  # reaped already
            if info:
                del self._polled[pid]
                on_exit()
                fired = True
        return fired

    # -- the reader ----------------------------------------------------------------------

    def _listen(self) -> None:
        """Put the socket in the selector while someone waits on events, else take it out."""
        want = self._subscribers > 0
        if want and not self._listening:
            self._drain_socket()  # what queued while nobody listened: read it from the file now
            self._selector.register(self._sock, selectors.EVENT_READ)
            self.timeline.refresh()
        elif self._listening and not want:
            self._selector.unregister(self._sock)
        self._listening = want

    def _run(self) -> None:
        while True:
            changed = exited = False
            for key, _ in self._selector.select(self._safety if self._listening or self._polled else None):
                if key.fileobj is self._sock:
                    self._drain_socket()
                elif key.fileobj == self._poke_r:
                    drain_pipe(self._poke_r)
                    changed = True  # a new watch, a new fault entry, or close()
                else:
                    fd = key.fd
                    self._selector.unregister(fd)
                    _pid, on_exit = self._pidfds.pop(fd)
                    os.close(fd)
                    on_exit()
                    exited = True
            if self._closed:
                return
            self._take_watches()
            self._listen()  # a new listener (poked): listen, and read what it may wait for
            exited = self._check_polled() or exited
            if exited:
                self.timeline.refresh()
                self.notify(lifecycle=True)
            elif not (self._listening and self.timeline.refresh()) and changed:
                self.notify()  # (a refresh that read lines notified already)

    def _drain_socket(self) -> None:
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return

    def close(self) -> None:
        """Stop the reader, wake every waiter, remove the socket; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._poke()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self.timeline.close()  # the last lines, read while the file still exists
        self.notify(lifecycle=True)
        self._selector.close()
        self._sock.close()
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()
        os.close(self._poke_r)
        os.close(self._poke_w)
        try:
            os.unlink(self.wake_path)
        except FileNotFoundError:
            pass
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
