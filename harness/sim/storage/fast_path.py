"""Where the storage server's writes stop paying Python for every byte.

A checkpoint save is a few writes of megabytes, and a FUSE write copies its data four times
(the writer's buffer into the FUSE file's page cache, that into libfuse's buffer, that into a
Python ``bytes``, that into the backing file): the bench measured 1.8x a direct save. Two
changes take out two of those copies without changing what the server sees:

* **direct writes**: a handle opened write-only is opened FOPEN_DIRECT_IO, so
  the kernel hands the writer's own pages to the request instead of staging them in the FUSE
  file's page cache. Every write still reaches the server before the syscall returns, which
  is what the write-back record needs (the kernel's ``writeback_cache`` would not: its
  flusher, not the writer, would send the data, and a crash could no longer be charged to the
  node that wrote). Readers keep the page cache. (An append after a crash rolled its file
  back lands at the rolled-back end: tests/harness/test_storage_fs.py.)
* **buffer copy**: ``write_buf`` gives libfuse's buffer to libfuse's own ``fuse_buf_copy``
  (a ``pwrite`` from its memory, the GIL released) instead of a ``bytes`` copy of it.

Only this module and ``server`` import mfusepy; the server process imports this one.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import mfusepy

__all__ = ["FastFUSE", "buffer_size", "copy_buffer_to_fd"]

_BUF_IS_FD = 1 << 1
_BUF_FD_SEEK = 1 << 2
_BUF_FD_RETRY = 1 << 3


class _Buf(ctypes.Structure):
    """libfuse 3's ``struct fuse_buf`` (a later libfuse appends ``mem_size``: see the padding)."""

    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


class _BufVec(ctypes.Structure):
    """``struct fuse_bufvec``: its ``buf[1]`` is inline (mfusepy declares it a pointer, which
    is why the server declares its own). The zeroed padding is room for fields a later
    libfuse appends to ``fuse_buf``."""

    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", _Buf * 1), ("_padding", ctypes.c_char * 64)]


_libfuse = mfusepy._libfuse
_libfuse.fuse_buf_size.restype = ctypes.c_size_t
_libfuse.fuse_buf_size.argtypes = [ctypes.c_void_p]
_libfuse.fuse_buf_copy.restype = ctypes.c_ssize_t
_libfuse.fuse_buf_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]


def buffer_size(source: Any) -> int:
    """The bytes in the buffer vector libfuse passed to ``write_buf``."""
    return int(_libfuse.fuse_buf_size(ctypes.cast(source, ctypes.c_void_p)))


def copy_buffer_to_fd(source: Any, size: int, fd: int, offset: int) -> int:
    """Write libfuse's buffer vector (``size`` bytes: ``buffer_size``, which the caller has
    already asked) into ``fd`` at ``offset``: the bytes written, or OSError."""
    destination = _BufVec(count=1, idx=0, off=0)
    destination.buf[0] = _Buf(size=size, flags=_BUF_IS_FD | _BUF_FD_SEEK | _BUF_FD_RETRY,
                              mem=None, fd=fd, pos=offset)
    written = int(_libfuse.fuse_buf_copy(ctypes.byref(destination), ctypes.cast(source, ctypes.c_void_p), 0))
    if written < 0:
        raise OSError(-written, os.strerror(-written))
    return written


def _direct(fip: Any) -> None:
    flags = fip.contents.flags
    if flags & os.O_ACCMODE == os.O_WRONLY:
        fip.contents.direct_io = 1


class FastFUSE(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, opening write-only handles for direct writes (see the module text)."""

    def open(self, path: bytes, fip: Any) -> int:
        result = int(super().open(path, fip))
        _direct(fip)
        return result

    def create(self, path: bytes, mode: int, fip: Any) -> int:
        result = int(super().create(path, mode, fip))
        _direct(fip)
        return result
