"""Running nftables scripts inside a node's namespace, fast.

A fault is timed from the call to the first dropped packet, so starting an ``nft`` process
(a fork of this big interpreter, an exec, a library load: 10-40 ms on a busy machine) is too
slow. ``libnftables`` (what the ``nft`` binary is a front end to) talks netlink through a
socket made when its context is created, and a socket stays in the namespace it was made
in. So a short-lived thread joins the node's namespace, creates the context and ends; this
process's own threads never change namespace, and each script after that is one netlink
transaction (~1 ms). Where the library cannot be loaded, the ``nft`` binary is run instead.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from typing import Protocol

from harness.procs import join_netns

__all__ = ["Nft", "open_nft"]


class Nft(Protocol):
    def run(self, script: str) -> str | None:
        """Apply ``script``; None on success, else nft's error text."""

    def close(self) -> None: ...


_lib: ctypes.CDLL | None = None
_lib_failed = False


def _library() -> ctypes.CDLL | None:
    global _lib, _lib_failed
    if _lib is None and not _lib_failed:
        try:
            lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
        except OSError:
            _lib_failed = True
            return None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        _lib = lib
    return _lib


class _LibNft:
    """A libnftables context whose netlink socket lives in one namespace."""

    def __init__(self, lib: ctypes.CDLL, namespace_fd: int):
        self._lib = lib
        box: dict[str, object] = {}

        def make() -> None:  # this thread alone enters the namespace, then ends
            try:
                join_netns(namespace_fd)
                box["ctx"] = lib.nft_ctx_new(0)
            except OSError as e:
                box["error"] = e

        thread = threading.Thread(target=make, name="nft-context")
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        if not box.get("ctx"):
            raise OSError("nft_ctx_new failed")
        self._ctx: int | None = box["ctx"]  # type: ignore[assignment]
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)

    def run(self, script: str) -> str | None:
        if self._lib.nft_run_cmd_from_buffer(self._ctx, script.encode()) == 0:
            return None
        return (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")

    def close(self) -> None:
        """Free the context: its socket holds the namespace alive until then."""
        if self._ctx:
            self._lib.nft_ctx_free(self._ctx)
            self._ctx = None


class _BinaryNft:
    """``nft -f -`` started inside the namespace: slower, needs only the binary."""

    def __init__(self, namespace_fd: int):
        self._fd = namespace_fd

    def run(self, script: str) -> str | None:
        fd = self._fd
        out = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True,
                             preexec_fn=lambda: join_netns(fd))
        return None if out.returncode == 0 else out.stderr

    def close(self) -> None:
        pass


def open_nft(namespace_fd: int) -> Nft:
    """The fastest way available to run nft scripts in the namespace behind ``namespace_fd``."""
    lib = _library()
    if lib is not None:
        try:
            return _LibNft(lib, namespace_fd)
        except OSError:
            pass
    return _BinaryNft(namespace_fd)
