"""What a zygote's workers imported, kept on disk so that the next process's zygote starts warm.

Why: the zygote learns which modules a job's workers import and preloads them
(``harness.procs._preload``), so a restart on a warm pool costs ~0.1 s instead of ~1.1 s. What
it learned died with it: a fresh session's first jobs, and every bare ``Cluster()`` (a private
pool, closed with its job), imported ``torch.distributed.checkpoint`` and ``torch._dynamo``
again in every restarted worker. This module keeps what was learned between processes.

What is kept: module *names* only -- never code, never a pickle -- as JSON, one file per
target (the script, module or callable the workers ran: ``_preload.target_key``), and only
names the caller's ``allowed`` rule accepts (the zygote's: ``_preload.module_name``, a module
name). The file is read by a process that will import what it names, so the rule is applied
on the way in as well as on the way out, and the zygote's preloader applies its own on top:
torch, numpy, the standard library, and the packages the target's workers allow. Beside
them, ``avoid.json`` names modules never to preload again (their import left a thread
behind, or failed, in some zygote).

Keyed by interpreter: one directory per ``sys.executable`` + ``sys.version`` + torch version
(``Interpreter``), because a name learned under one torch may not exist under another.

Where: ``$HARNESS_IMPORT_CACHE`` (a directory; ``0`` or ``off`` turns the cache off), else
``$XDG_CACHE_HOME/pytest-elastic``, else ``~/.cache/pytest-elastic`` (``import_cache_dir``).

Concurrency: xdist workers and concurrent processes share the directory. A writer holds a
``flock`` on ``.lock`` (waiting a bounded time, then giving up: a stopped writer must not stop
a zygote), re-reads the file, merges, writes a temporary file and renames it over the old one:
a reader sees the old file or the new one, never half of one, and two zygotes that learned
different things about the same target both keep theirs.

Bounded: a file over ``MAX_FILE_BYTES`` is not read, a target keeps ``MAX_NAMES`` names, and
the least recently used targets beyond ``MAX_TARGETS`` are removed. Garbage (not JSON, the
wrong shape, names that may not be preloaded) is ignored with one line on stderr; a cache that
cannot be written is said once and then left alone. Nothing here raises into the zygote.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = ["IMPORT_CACHE_ENV", "ImportCache", "Interpreter", "import_cache_dir"]

IMPORT_CACHE_ENV = "HARNESS_IMPORT_CACHE"  # a directory, or 0/off: no cache
OFF_VALUES = frozenset({"0", "off"})
FORMAT = 1  # bumped when the file's shape changes: an old file is then ignored, not misread
MAX_FILE_BYTES = 1024 * 1024  # a target's file: ~16 KB for the DCP trainer's 420 names
MAX_NAMES = 4096  # per target
MAX_TARGETS = 256  # files kept per interpreter, least recently used removed first
LOCK_WAIT_S = 1.0  # a writer waits this long for another; then it skips the write
STALE_TMP_S = 60.0  # a temporary file this old was left by a writer that was killed
AVOID = "avoid.json"


def import_cache_dir(env: Mapping[str, str]) -> str | None:
    """The cache's directory from ``env`` (None: turned off); resolved once, where a zygote
    is started."""
    value = env.get(IMPORT_CACHE_ENV, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is to be ignored
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pytest-elastic")


@dataclass(frozen=True)
class Interpreter:
    """What a learned name is valid for: the same Python binary and version, the same torch."""

    executable: str
    python: str
    torch: str

    @classmethod
    def current(cls) -> Interpreter:
        """This process's (torch as imported here: the zygote has; "none" where it has not)."""
        torch = sys.modules.get("torch")
        return cls(sys.executable, sys.version, str(getattr(torch, "__version__", "none")))

    def dir_name(self) -> str:
        """Readable where it can be, unique by its digest."""
        digest = hashlib.sha256("\0".join((self.executable, self.python, self.torch)).encode()).hexdigest()
        version = self.python.split()[0] if self.python.strip() else "unknown"
        readable = re.sub(r"[^\w.+-]", "_", f"py{version}-torch{self.torch}")[:60]
        return f"imports-{readable}-{digest[:16]}"


class ImportCache:
    """The learned names of one interpreter's targets, in ``directory``/``Interpreter.dir_name()``.

    ``allowed`` is the rule a name must pass to be kept or read back (the zygote's: ``module_name``);
    passed in rather than imported, so this module holds the storage and ``_preload`` the
    policy."""

    def __init__(self, directory: str, interpreter: Interpreter, allowed: Callable[[str], bool]) -> None:
        self.directory = os.path.join(directory, interpreter.dir_name())
        self.allowed = allowed
        self._said: set[str] = set()  # "read", "write": each kind of problem is said once
        self._writable = True
        self._prune()

    def __repr__(self) -> str:
        return f"ImportCache({self.directory!r}{'' if self._writable else ', not writable'})"

    # -- reading -------------------------------------------------------------------------

    def path(self, key: str) -> str:
        return os.path.join(self.directory, hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def names(self, key: str) -> list[str]:
        """What ``key``'s workers imported, as far as any earlier process learned (garbage
        ignored); marks the target used, so it is the last to be removed."""
        path = self.path(key)
        data = self._read(path, "modules", key)
        if data:
            with contextlib.suppress(OSError):
                os.utime(path)
        return data

    def avoided(self) -> set[str]:
        """Names no zygote may preload (one left a thread behind, or failed to import)."""
        return set(self._read(os.path.join(self.directory, AVOID), "avoid", None))

    def _read(self, path: str, field: str, key: str | None) -> list[str]:
        """The names under ``field`` in the file at ``path`` (for target ``key``), or [] when
        there is none or it is garbage (said once)."""
        try:
            with open(path, "rb") as fp:
                raw = fp.read(MAX_FILE_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            self._say("read", f"cannot read {path}: {e.strerror}")
            return []
        if len(raw) > MAX_FILE_BYTES:
            self._say("read", f"ignoring {path}: larger than {MAX_FILE_BYTES} bytes")
            return []
        try:
            data = json.loads(raw)
        except ValueError:
            self._say("read", f"ignoring {path}: not JSON")
            return []
        if (not isinstance(data, dict) or data.get("format") != FORMAT or data.get("target") != key
                or not isinstance(data.get(field), list)):
            self._say("read", f"ignoring {path}: not an import cache file of format {FORMAT}"
                      + (f" for {key}" if key is not None else ""))
            return []
        names = data[field]
        kept = _unique(n for n in names if isinstance(n, str) and self.allowed(n))[:MAX_NAMES]
        if len(kept) < len(names):
            self._say("read", f"{path}: ignored {len(names) - len(kept)} of {len(names)} names "
                      "(not module names this cache may hold, repeated, or too many)")
        return kept

    # -- writing -------------------------------------------------------------------------

    def remember(self, key: str, names: Iterable[str]) -> None:
        """Add ``names`` to what ``key``'s workers import (merged with what other processes
        wrote meanwhile)."""
        new = [n for n in names if self.allowed(n)]
        if new:
            self._merge(self.path(key), "modules", key, new)

    def avoid(self, name: str) -> None:
        """Never preload ``name`` again, in any process of this interpreter."""
        if self.allowed(name):
            self._merge(os.path.join(self.directory, AVOID), "avoid", None, [name])

    def _merge(self, path: str, field: str, key: str | None, new: list[str]) -> None:
        if not self._writable:
            return
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with self._locked() as locked:
                if not locked:
                    return  # another writer holds it for long: this is best effort
                old = self._read(path, field, key)
                merged = _unique([*old, *new])[:MAX_NAMES]
                if merged != old:
                    _write_whole(path, {"format": FORMAT, "target": key, field: merged})
        except OSError as e:
            self._writable = False
            self._say("write", f"cannot write to {self.directory}: {e.strerror or e} (not written again "
                      f"by this process; {IMPORT_CACHE_ENV}=0 turns the cache off)")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        fd = os.open(os.path.join(self.directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                        yield False
                        return
                time.sleep(0.002)  # flock has no timed wait; holders hold it for a millisecond
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _prune(self) -> None:
        """Remove the least recently used targets beyond ``MAX_TARGETS``, and temporary files
        of writers that were killed mid-write."""
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        now = time.time()
        targets = []
        for entry in entries:
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            if entry.name.startswith(".tmp-") and now - mtime > STALE_TMP_S:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            elif entry.name.endswith(".json") and entry.name != AVOID:
                targets.append((mtime, entry.path))
        targets.sort()
        for _mtime, path in targets[:max(0, len(targets) - MAX_TARGETS)]:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _say(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            print(f"[zygote] import cache: {message}", file=sys.stderr, flush=True)


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _write_whole(path: str, data: dict[str, object]) -> None:
    """Write to a temporary file beside ``path`` and rename it over ``path``: readers see the
    old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            json.dump(data, fp, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
