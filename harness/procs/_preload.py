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
(docs/elastic-run.md, "The zygote start method"). A job may allow more packages for its
own workers (``HARNESS_PRELOAD`` in their environment, e.g. ``transformers,lightning``):
a framework's import (about 2 s for transformers or lightning) is otherwise paid again by
every restarted worker, and a job that names it accepts that the package reads its
import-time configuration from the zygote's environment. The allowance is per target: a
name learned under it is preloaded for that target's workers only while they still name
the package, and never for another target's. A module whose import starts a thread
stops the learning (forking with more threads is what the zygote must not do), and a
module that fails to import is not tried again.

**Across processes** (``harness.procs._import_cache``): what a target's workers imported
(``target_key``: the script's content, the module, the callable's name) is also kept on disk,
so a fresh zygote -- a new session's pool, a bare ``Cluster()``'s private one -- knows it
too. It does not import all it knows at start: a job that does not need ``torch._dynamo``
must not wait 1.7 s for it. Before it forks a worker for a target with no worker of its own
alive (a job's first worker, a restart), it imports what that target's workers imported
before, then forks: the first worker waits for what it would have imported itself (once,
instead of once per worker), and every later fork for it, a restart, is warm.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickletools
import socket
import sys
import threading
import time
from dataclasses import dataclass

from harness.procs._import_cache import ImportCache

__all__ = ["PRELOAD_ENV", "PRELOAD_PACKAGES", "Preloader", "extra_packages", "module_name", "note_fork",
           "share_imports", "target_key"]

#: top-level packages (besides the standard library) whose submodules the zygote may preload
PRELOAD_PACKAGES = frozenset({"torch", "numpy"})
#: a worker's environment variable naming more top-level packages the zygote may preload for
#: its target (comma- or space-separated), e.g. ``transformers,accelerate``
PRELOAD_ENV = "HARNESS_PRELOAD"
MAX_EXTRA = 32  # packages one target may add
#: never imported in the zygote: they act on import (a browser, a poem) or are per-process
NEVER = frozenset({"__main__", "__mp_main__", "antigravity", "this", "idlelib", "tkinter", "turtle"})
IDLE_S = 0.05  # the zygote imports a queued module after this long without a request
MAX_KEY = 1000  # characters of a target key a worker may send
MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # a bigger script gets no key: hashing it would hold the zygote
PAYLOAD_HEAD = 64 * 1024  # where a callable payload names its function (the tuple's first item)
KNOWN_KEYS = 64  # targets whose names one zygote keeps in memory (its forks inherit them)


def preloadable(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether the zygote may import ``name`` for a target whose workers allow the
    top-level packages ``extra`` (``HARNESS_PRELOAD``) besides torch, numpy and the
    standard library."""
    top = name.partition(".")[0]
    if top in NEVER or name in NEVER:
        return False
    return top in PRELOAD_PACKAGES or top in sys.stdlib_module_names or top in extra


def module_name(name: str) -> bool:
    """Whether ``name`` could be preloaded for some target (a dotted name, never one of
    ``NEVER``): the import cache's rule. Which target may have it preloaded is the
    preloader's to decide, with that target's allowance."""
    return bool(name) and all(part.isidentifier() for part in name.split(".")) and preloadable(
        name, frozenset({name.partition(".")[0]}))


def extra_packages(value: object) -> frozenset[str]:
    """The top-level packages a ``HARNESS_PRELOAD`` value names; what is not a package name
    (a dotted name, a path, garbage) is ignored, and at most ``MAX_EXTRA`` are kept."""
    if not isinstance(value, str):
        return frozenset()
    names = [n for n in value.replace(",", " ").split() if n.isidentifier() and n not in NEVER]
    return frozenset(names[:MAX_EXTRA])


def target_key(target: str, module: bool, is_callable: bool, cwd: str) -> str | None:
    """What identifies the workers of one job across processes, for the import cache: a
    script by its content (a test's script written anew to each run's ``tmp_path`` is still
    the same script; an edited one is a new one), a module by its name and the directory it
    is run from, a callable by the module and name of the function in its pickle. None when
    there is no such name (an unreadable file, an odd pickle): nothing is kept for it."""
    if is_callable:
        name = _pickled_function(target)
        return f"callable:{name}" if name else None
    if module:
        return f"module:{cwd}:{target}"
    try:
        with open(os.path.join(cwd, target), "rb") as fp:
            content = fp.read(MAX_SCRIPT_BYTES + 1)
    except OSError:
        return None
    if len(content) > MAX_SCRIPT_BYTES:
        return None
    return f"script:{hashlib.sha256(content).hexdigest()}"


def _pickled_function(payload_path: str) -> str | None:
    """``module.qualname`` of the first global in a callable payload ``(fn, args, return_path)``:
    the function. Read from the pickle's opcodes, never unpickled here -- that would import
    the user's module in the zygote."""
    try:
        with open(payload_path, "rb") as fp:
            head = fp.read(PAYLOAD_HEAD)
    except OSError:
        return None
    strings: list[str] = []
    try:
        for opcode, arg, _pos in pickletools.genops(head):
            if opcode.name == "GLOBAL" and isinstance(arg, str):
                return arg.replace(" ", ".")
            if opcode.name == "STACK_GLOBAL":
                return ".".join(strings[-2:]) if len(strings) >= 2 else None
            if isinstance(arg, str) and "UNICODE" in opcode.name:
                strings.append(arg)
    except (ValueError, EOFError, IndexError):  # not a pickle, or cut short by PAYLOAD_HEAD
        return None
    return None


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


@dataclass
class _Target:
    """What one zygote knows of one target: the packages its workers allow besides torch,
    numpy and the standard library (their ``HARNESS_PRELOAD``), and what they imported, in
    order and filtered by that allowance (None until read from the cache under it)."""

    allowed: frozenset[str] = frozenset()
    imported: list[str] | None = None


class Preloader:
    """The zygote's queue of modules its workers imported and it has not, the thread that
    imports them, and what each target's workers import (kept in ``cache``, when given).

    A thread, not the zygote's own loop: the loop reaps workers and reports their exits,
    and an import holds it for up to 1.7 s (``torch._dynamo``) -- a fault's detection
    would wait for it. The loop stops the thread (after the module it is in) and joins it
    before every fork, so no worker is forked mid-import. ``before_fork`` imports on the
    loop itself, but only while no worker of the zygote is alive: then there is no exit to
    report."""

    def __init__(self, cache: ImportCache | None = None) -> None:
        #: (module, the target key whose worker reported it) to import between jobs
        self.pending: list[tuple[str, str | None]] = []
        self.tried: set[str] = set()
        self.learning = True
        self.cache = cache
        self.avoid: set[str] = cache.avoided() if cache is not None else set()  # failed or left a thread
        self.targets: dict[str, _Target] = {}  # target key -> its allowance and its workers' imports
        self._baseline = _thread_count()  # torch's own threads, there before any preload
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._culprit: str | None = None  # the module after whose import the thread saw a new thread

    def learn(self, names: object, key: object = None) -> int:
        """Queue what a worker reported (garbage is ignored), and remember it for the
        worker's target ``key``; how many names were new to the queue."""
        if not isinstance(names, list):
            return 0
        valid_key = key if isinstance(key, str) and 0 < len(key) <= MAX_KEY else None
        extra = self._allowed(valid_key)
        clean = [n for n in names if isinstance(n, str) and n not in self.avoid and preloadable(n, extra)]
        if valid_key is not None and clean:
            self._remember(valid_key, clean)
        if not self.learning:
            return 0
        new = 0
        for name in clean:
            if name not in self.tried and name not in sys.modules:
                self.tried.add(name)
                self.pending.append((name, valid_key))
                new += 1
        return new

    def _allowed(self, key: str | None) -> frozenset[str]:
        target = self.targets.get(key) if key is not None else None
        return target.allowed if target is not None else frozenset()

    def _target(self, key: str) -> _Target:
        """``key``'s record, made (evicting the oldest past ``KNOWN_KEYS``) if new."""
        target = self.targets.get(key)
        if target is None:
            if len(self.targets) >= KNOWN_KEYS:
                del self.targets[next(iter(self.targets))]
            target = self.targets[key] = _Target()
        return target

    def _known(self, key: str) -> list[str]:
        target = self._target(key)
        if target.imported is None:
            cached = self.cache.names(key) if self.cache is not None else []
            target.imported = [n for n in cached if n not in self.avoid and preloadable(n, target.allowed)]
        return target.imported

    def allow(self, key: str | None, extra: frozenset[str]) -> None:
        """What the workers about to be forked for ``key`` allow besides torch, numpy and
        the standard library (their ``HARNESS_PRELOAD``). A changed allowance re-reads what
        the target's workers imported with the new rule, and drops from the idle queue what
        they reported under the old one that the new one refuses: a package no longer named
        is no longer preloaded for them, before a fork or between jobs."""
        if key is None or self._allowed(key) == extra:
            return
        target = self._target(key)
        target.allowed = extra
        target.imported = None
        refused = [(n, k) for n, k in self.pending if k == key and not preloadable(n, extra)]
        if refused:
            self.pending = [entry for entry in self.pending if entry not in refused]
            self.tried.difference_update(n for n, _ in refused)  # a later allowance may queue them again

    def _remember(self, key: str, names: list[str]) -> None:
        known = self._known(key)
        seen = set(known)
        fresh = [n for n in dict.fromkeys(names) if n not in seen]
        if fresh:
            known.extend(fresh)
            if self.cache is not None:
                self.cache.remember(key, fresh)

    def before_fork(self, key: str | None, workers_alive: bool, extra: frozenset[str] = frozenset()) -> None:
        """Before a fork for target ``key``: stop the import thread (``pause``); then, if no
        worker of this zygote is alive, import what ``key``'s workers imported before (in
        this zygote or, from the cache, in an earlier process). The worker about to be forked
        would import those itself; here they are imported once for it and every later fork
        (a restart). While workers are alive, fork at once: importing would compete with
        their training and delay the reports of their exits. ``extra``: the packages the
        workers allow (``allow``)."""
        self.pause()
        self.allow(key, extra)
        if key is None or workers_alive or not self.learning:
            return
        for name in self._known(key):
            if name in sys.modules or name in self.avoid:
                continue
            self._import(name)
            if _thread_count() > self._baseline:
                self._left_a_thread(name)
                return

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
        job; a private pool gets them from ``before_fork`` (what was learned for the target)."""
        if not workers_alive and self.pending and self.learning and self._thread is None:
            self._stop.clear()
            self._culprit = None
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
            self._left_a_thread(self._culprit)

    def _left_a_thread(self, name: str | None) -> None:
        """Stop all preloading in this zygote, and (when the module is known) in every
        later one: it must not fork with more threads than it started with."""
        self.learning = False
        self.pending.clear()
        if name is not None:
            self._avoid(name)
        print(f"[zygote] a preloaded module ({name or 'unknown'}) started a thread: no more preloading",
              file=sys.stderr, flush=True)

    def _avoid(self, name: str) -> None:
        self.avoid.add(name)
        if self.cache is not None:
            self.cache.avoid(name)

    def _import(self, name: str) -> None:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001  a worker imported it; here it may still fail
            self._avoid(name)
            print(f"[zygote] not preloading {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _import_pending(self) -> None:
        while self.pending and not self._stop.is_set():
            name, _key = self.pending.pop(0)
            if name in sys.modules or name in self.avoid:
                continue
            self._import(name)
            if _thread_count() > self._baseline + 1:  # + this thread; pause() has the last word
                self._culprit = name
                return


# -- the worker side ----------------------------------------------------------------------

_forked: dict[str, object] = {}  # in a zygote worker: the zygote's socket path and what was shared


def note_fork(path: str, key: str | None = None) -> None:
    """In a freshly forked worker: remember the zygote, the target it was forked for and
    what it had imported."""
    _forked.clear()
    _forked["path"] = path
    _forked["key"] = key
    _forked["shared"] = set(sys.modules)


def share_imports() -> None:
    """Tell the zygote that forked this worker which modules it has imported since (a
    no-op in any other process). Best effort: a zygote that is gone or busy loses nothing
    but the chance to preload."""
    path = _forked.get("path")
    shared = _forked.get("shared")
    if not isinstance(path, str) or not isinstance(shared, set):
        return
    extra = extra_packages(os.environ.get(PRELOAD_ENV))
    new = [name for name in list(sys.modules) if name not in shared and preloadable(name, extra)]
    shared.update(new)
    if not new:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(1.0)
            sock.connect(path)
            data = json.dumps({"op": "learn", "modules": new, "key": _forked.get("key")},
                              separators=(",", ":")).encode()
            sock.send(data)
    except (OSError, ValueError):
        pass
