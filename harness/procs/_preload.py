"""The zygote learns what its workers import, and imports it while idle, so the next worker
forked from it (a restart, the next test's job) starts with it.

Why: a restarted worker spends most of its start-up importing, not rendezvousing. The
DCP trainer of ``scenarios/training`` imports ``torch.distributed.checkpoint`` (0.6 s on
these machines) and DDP's constructor imports ``torch._dynamo`` (1.7 s, sympy with it); a
worker forked from a zygote that holds only ``torch`` pays both on every restart, which is
most of what a fault costs (``bench/resume.py``: 1.3 s of 1.3 s was "startup"). A static
list would guess; the workers know. So:

* **worker side** (``share_imports``): a worker forked by the zygote sends the names of the
  modules it imported since the fork to the zygote, on a new connection to its socket (a
  file path, reachable from any network namespace). The harness calls it at a worker's
  first ``report_step``, when a checkpoint save ends, and when the worker's target
  returns; a worker that never reports still teaches the zygote when it ends normally.
  Each name is sent once per worker.
* **server side** (``Preloader``): the zygote queues the names it may import and, between
  jobs (no worker of it alive, idle for ``IDLE_S``), imports them on a thread while its
  loop goes on serving. Before each fork the loop stops that thread after its current
  module and joins it: a spawn waits for one module at most, which the worker it is for
  would have had to import itself.

What the zygote may import: ``torch`` (and its submodules), ``numpy``, and the standard
library; never user code, whose import-time side effects (reading ``RANK``, opening files)
must happen in the worker. Those allowed packages read their import-time configuration
from the zygote's environment (the harness's), as ``torch`` itself always has here
(README: "Differences from a fresh interpreter"). A module whose import starts a thread
stops the learning (forking with more threads is what the zygote must not do), and a
module that fails to import is not tried again.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import threading
import time

__all__ = ["PRELOAD_PACKAGES", "Preloader", "note_fork", "share_imports"]

#: top-level packages (besides the standard library) whose submodules the zygote may preload
PRELOAD_PACKAGES = frozenset({"torch", "numpy"})
#: never imported in the zygote: they act on import (a browser, a poem) or are per-process
NEVER = frozenset({"__main__", "__mp_main__", "antigravity", "this", "idlelib", "tkinter", "turtle"})
IDLE_S = 0.05  # the zygote imports a queued module after this long without a request


def preloadable(name: str) -> bool:
    top = name.partition(".")[0]
    if top in NEVER or name in NEVER:
        return False
    return top in PRELOAD_PACKAGES or top in sys.stdlib_module_names


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _wait_gone(native_id: int | None, limit_s: float = 1.0) -> None:
    """``join`` returns once the thread's Python part is done; its OS thread may still be
    listed in ``/proc/self/task`` for a moment, and the count that follows must not take it
    for a thread an import left behind."""
    deadline = time.monotonic() + limit_s
    while native_id is not None and os.path.exists(f"/proc/self/task/{native_id}") and time.monotonic() < deadline:
        time.sleep(0.0005)


class Preloader:
    """The zygote's queue of modules its workers imported and it has not, and the thread
    that imports them.

    A thread, not the zygote's own loop: the loop reaps workers and reports their exits,
    and an import holds it for up to 1.7 s (``torch._dynamo``) -- a fault's detection
    would wait for it. The loop stops the thread (after the module it is in) and joins it
    before every fork, so no worker is forked mid-import."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.tried: set[str] = set()
        self.learning = True
        self._baseline = _thread_count()  # torch's own threads, there before any preload
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def learn(self, names: object) -> int:
        """Queue what a worker reported (garbage is ignored); how many names were new."""
        if not self.learning or not isinstance(names, list):
            return 0
        new = 0
        for name in names:
            if (isinstance(name, str) and name not in self.tried and name not in sys.modules
                    and preloadable(name)):
                self.tried.add(name)
                self.pending.append(name)
                new += 1
        return new

    def idle_timeout(self, workers_alive: bool) -> float | None:
        """How long the zygote may block waiting for requests before it starts importing:
        forever while any worker of it lives (see ``start``), when nothing is queued, or
        when an import is under way."""
        if workers_alive or not self.pending or not self.learning or self._thread is not None:
            return None
        return IDLE_S

    def start(self, workers_alive: bool) -> None:
        """Import the queued modules in the background: only between jobs, when no worker
        of this zygote is alive. During a job the import would compete with the training
        for the CPU, and a restart arriving mid-import waits for it: on a cold pool the
        first restart measured 2-4x slower that way (``bench/resume.py``). A pool that
        outlives the job (the plugin's per-session pool) gets the modules for every later
        job; a private pool is closed before it ever imports them."""
        if not workers_alive and self.pending and self.learning and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._import_pending, name="zygote-preload", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Before a fork: let the module being imported finish, stop there, and check that
        no import left a thread behind."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        _wait_gone(self._thread.native_id)
        self._thread = None
        if _thread_count() > self._baseline:
            self.learning = False
            self.pending.clear()
            print("[zygote] a preloaded module started a thread: no more preloading",
                  file=sys.stderr, flush=True)

    def _import_pending(self) -> None:
        while self.pending and not self._stop.is_set():
            name = self.pending.pop(0)
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except BaseException as e:  # noqa: BLE001  a worker imported it; here it may still fail
                print(f"[zygote] not preloading {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


# -- the worker side ----------------------------------------------------------------------

_forked: dict[str, object] = {}  # in a zygote worker: the zygote's socket path and what was shared


def note_fork(path: str) -> None:
    """In a freshly forked worker: remember the zygote and what it had imported."""
    _forked.clear()
    _forked["path"] = path
    _forked["shared"] = set(sys.modules)


def share_imports() -> None:
    """Tell the zygote that forked this worker which modules it has imported since (a
    no-op in any other process). Best effort: a zygote that is gone or busy loses nothing
    but the chance to preload."""
    path = _forked.get("path")
    shared = _forked.get("shared")
    if not isinstance(path, str) or not isinstance(shared, set):
        return
    new = [name for name in list(sys.modules) if name not in shared and preloadable(name)]
    shared.update(new)
    if not new:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(1.0)
            sock.connect(path)
            data = json.dumps({"op": "learn", "modules": new}, separators=(",", ":")).encode()
            sock.send(data)
    except (OSError, ValueError):
        pass
