"""The write-back record: what each file holds that was never fsynced, and who wrote it.

The harness's filesystem writes through to its backing directory at once (reads need no
cache, and a crash of the harness itself loses nothing), and keeps beside it, per file
(per backing inode, so renames move nothing), what a crash of the writing node would take
back: the size the file had at its last fsync, the bytes it overwrote below that size since
then (an undo log), and its last unsynced write (for a torn write). ``crash(node)`` rolls
every file that node dirtied back to its last fsynced state, as LazyFS's ``clear-cache``
does. The semantics, in one place:

* ``fsync``/``fdatasync`` of a file (by any process) makes everything written to it durable;
  ``close`` does not, nor does a process's exit: only a *node* crash loses data;
* namespace operations (create, mkdir, rename, unlink, truncate) are durable on return, as
  a journaling filesystem commits them: a file created but never fsynced survives a crash
  with its fsynced length, which for a new file is zero bytes (ext4's classic zero-length
  file after a crash); a renamed file keeps the name and loses its unsynced content, so a
  write-then-rename without fsync yields an empty (or truncated) file under the new name.
  Directory fsync is passed through but changes nothing here (not modelled);
* a file dirtied by several nodes before its next fsync is rolled back whole when any of
  them crashes (a shared page cache; fine for checkpoints, where each file has one writer);
* ``torn=True``: besides the fsynced state, a prefix of the file's last unsynced write
  survives (half of it, cut at a 4 KiB page boundary when it is larger than a page): the
  node died in the middle of that write.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

__all__ = ["FileRecord", "WriteBack", "Lost", "torn_prefix"]

_PAGE = 4096


def torn_prefix(length: int) -> int:
    """How many bytes of a torn write of ``length`` survive: half, page-aligned when possible."""
    half = length // 2
    return half - half % _PAGE if half >= _PAGE else half


@dataclass
class FileRecord:
    """The unsynced state of one backing file."""

    synced_size: int
    fd: int  # a dup of a descriptor open for writing: rollback survives renames and closes
    path: str  # backing path when first dirtied (for reports only)
    writers: set[int | None] = field(default_factory=set)
    undo: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, old bytes), oldest first
    last_write: tuple[int, int] | None = None  # (offset, length): its bytes are in the file
    unsynced_bytes: int = 0


@dataclass(frozen=True)
class Lost:
    """What a crash rolled back in one file (a report line, and what tests read)."""

    path: str
    synced_size: int
    size_before: int
    unsynced_bytes: int
    kept_torn: int
    size_after: int  # what the rollback left: never below ``synced_size`` (an invariant)


class WriteBack:
    """Every file with unsynced writes, keyed by backing (st_dev, st_ino)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[tuple[int, int], FileRecord] = {}

    def before_write(self, key: tuple[int, int], fd: int, path: str, node: int | None, offset: int,
                     length: int) -> None:
        """Note a write of ``length`` bytes at ``offset`` about to go through ``fd`` (call it
        before the write): below the fsynced size the old bytes go to the undo log."""
        with self._lock:
            record = self._files.get(key)
            if record is None:
                size = os.fstat(fd).st_size
                record = self._files[key] = FileRecord(size, os.dup(fd), path)
            if offset < record.synced_size:
                old = _read_old(record.fd, offset, min(length, record.synced_size - offset))
                record.undo.append((offset, old))
            record.writers.add(node)
            record.last_write = (offset, length)
            record.unsynced_bytes += length

    def truncated(self, key: tuple[int, int], length: int) -> None:
        """A truncate is durable at once: the fsynced state shrinks with it."""
        with self._lock:
            record = self._files.get(key)
            if record is not None and length < record.synced_size:
                record.synced_size = length
                record.undo = [(o, b[:max(0, length - o)]) for o, b in record.undo if o < length]

    def synced(self, key: tuple[int, int]) -> None:
        """``fsync`` succeeded: everything written to the file is durable."""
        with self._lock:
            record = self._files.pop(key, None)
        if record is not None:
            os.close(record.fd)

    def unlinked(self, key: tuple[int, int], nlink_left: int) -> None:
        """The last name is gone: nothing to roll back any more."""
        if nlink_left > 0:
            return
        self.synced(key)

    def forget(self) -> None:
        """Drop every record (the mount is gone: nothing will be rolled back any more)."""
        with self._lock:
            records, self._files = list(self._files.values()), {}
        for record in records:
            os.close(record.fd)

    def dirty(self, node: int | None = None) -> list[FileRecord]:
        """Files with unsynced writes (of ``node``, or of anyone)."""
        with self._lock:
            return [r for r in self._files.values() if node is None or node in r.writers]

    def crash(self, node: int, torn: bool = False) -> list[Lost]:
        """Roll back every file ``node`` dirtied to its fsynced state (``torn``: keep a prefix
        of its last unsynced write); what was lost, per file."""
        with self._lock:
            keys = [k for k, r in self._files.items() if node in r.writers]
            records = [self._files.pop(k) for k in keys]
        return [_roll_back(record, torn) for record in records]


def _read_old(fd: int, offset: int, length: int) -> bytes:
    """The bytes at ``offset`` before a write changes them (the fd may be write-only)."""
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(rfd, length, offset)
    finally:
        os.close(rfd)


def _roll_back(record: FileRecord, torn: bool) -> Lost:
    fd = record.fd
    try:
        size_before = os.fstat(fd).st_size
        kept, prefix = 0, b""
        if torn and record.last_write is not None:  # its bytes, read back before the rollback
            offset, length = record.last_write
            kept = torn_prefix(length)
            prefix = _read_old(fd, offset, kept)
        os.ftruncate(fd, record.synced_size)
        for offset, old in reversed(record.undo):
            os.pwrite(fd, old, offset)
        if prefix:
            os.pwrite(fd, prefix, record.last_write[0] if record.last_write else 0)
        return Lost(record.path, record.synced_size, size_before, record.unsynced_bytes, kept,
                    os.fstat(fd).st_size)
    finally:
        os.close(fd)
