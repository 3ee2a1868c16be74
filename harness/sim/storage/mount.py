"""The harness side of a job's filesystem: start its server, talk to it, unmount it.

``StorageMount(directory, events_path)`` serves ``directory/fs`` from ``directory/backing``
through ``harness.sim.storage.server`` (its own process, which dies with the harness:
PDEATHSIG). ``close()`` ends the server (libfuse unmounts on its way out) and lazily
unmounts whatever is left (a SIGKILLed server leaves a dead mount). A harness process that
died without closing leaves its mounts: ``sweep()`` (run before every new mount, and by
``harness.sim.leftovers`` before it removes a dead owner's directory) unmounts every
harness mount whose owner pid is dead, as dead owners' namespaces and temp dirs are removed.

Where FUSE cannot be had (``fuse_missing()`` says what is missing: ``/dev/fuse``, libfuse 3,
the ``mfusepy`` package, or the right to mount), ``fs`` is a plain directory and
``StorageMount.available`` is False.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.procs import process_state
from harness.sim.storage.link import LinkClosed
from harness.sim.storage.standby import LIBRARY_ENV, StandbyServer

__all__ = ["StorageMount", "fuse_missing", "FUSE_ENV", "sweep", "harness_mounts", "unmount", "FSNAME_PREFIX"]

FSNAME_PREFIX = "harness-"  # fsname harness-<owner pid>-<job>: the owner is in the name
SUBTYPE = "harness"
MOUNT_TIMEOUT = 15.0
#: "0": no FUSE filesystem for the jobs (plain directories; storage faults say so)
FUSE_ENV = "HARNESS_FUSE"


def fuse_missing() -> str | None:
    """What this machine lacks for the harness's filesystem (None: nothing).
    ``HARNESS_FUSE=0`` in the environment turns it off (plain directories)."""
    if os.environ.get(FUSE_ENV, "1") == "0":
        return f"FUSE, turned off here ({FUSE_ENV}=0)"
    return _machine_lacks()


@functools.lru_cache(maxsize=1)
def _machine_lacks() -> str | None:
    """Looked up, not loaded: importing mfusepy here (60 ms) would buy the harness nothing,
    and a server that cannot load it fails its mount, which ``wait_mounted`` reports."""
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as e:
        return f"/dev/fuse ({e.strerror}; a container needs --device /dev/fuse)"
    import importlib.util
    from ctypes.util import find_library

    if importlib.util.find_spec("mfusepy") is None:
        return "the mfusepy package (a dependency of pytest-elastic: pip install pytest-elastic, or mfusepy)"
    if find_library(LIBRARY_ENV["FUSE_LIBRARY_NAME"]) is None:
        return "libfuse 3 (apt-get install fuse3)"
    if os.geteuid() != 0 and not _which("fusermount3"):
        return "fusermount3 (apt-get install fuse3), or root"
    return None


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def harness_mounts() -> list[tuple[str, str]]:
    """(mount point, fsname) of every harness filesystem mounted now."""
    found = []
    try:
        with open("/proc/self/mountinfo") as fp:
            lines = fp.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        if tail[0] == f"fuse.{SUBTYPE}" and tail[1].startswith(FSNAME_PREFIX):
            point = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
            found.append((point, tail[1]))
    return found


def owner_of(fsname: str) -> int | None:
    pid = fsname[len(FSNAME_PREFIX):].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def unmount(point: str) -> None:
    """Detach ``point`` now (lazily: a process still inside it keeps it until it leaves)."""
    if os.geteuid() == 0:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    else:
        subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True, check=False)


def sweep(under: str | None = None) -> list[str]:
    """Unmount the harness mounts whose owner died (``under``: only those below that path,
    whoever owns them: their directory is about to be removed); their mount points."""
    swept = []
    for point, fsname in harness_mounts():
        if under is not None:
            if not (point == under or point.startswith(under.rstrip("/") + "/")):
                continue
        else:
            owner = owner_of(fsname)
            if owner is None or process_state(owner) not in (None, "Z"):  # alive (a zombie is not)
                continue
        unmount(point)
        swept.append(point)
    return swept


class StorageMount:
    """A job's filesystem: ``mountpoint`` served by a harness process, or a plain directory."""

    def __init__(self, directory: str, events_path: str | None, name: str,
                 on_request: Callable[[str, dict[str, Any]], Any] | None = None,
                 standby: StandbyServer | None = None,
                 give_back: Callable[[StandbyServer], None] | None = None):
        """``standby``: a server started ahead (a pool's); without one, or with one that
        died meanwhile, the mount starts its own. ``give_back``: where ``close`` hands the
        server once it has unmounted and stands by again (a pool); without it, it is ended."""
        self.mountpoint = os.path.join(directory, "fs")
        self.backing = os.path.join(directory, "backing")
        os.makedirs(self.mountpoint)
        os.makedirs(self.backing)
        self.missing = fuse_missing()
        self.fsname = f"{FSNAME_PREFIX}{os.getpid()}-{name}"
        self._on_request = on_request
        self._give_back = give_back
        self._mounted = threading.Event()
        self._server: StandbyServer | None = None
        self._log = os.path.join(directory, "storage.log")
        self.closed = False
        if self.missing is None:
            sweep()
            self._start(events_path, standby)
        elif standby is not None:  # not needed here (FUSE turned off): kept for a job that is
            self._hand_back(standby)

    @property
    def available(self) -> bool:
        """Whether ``mountpoint`` is served by the harness (False: a plain directory)."""
        return self._server is not None

    @property
    def server_pid(self) -> int | None:
        return self._server.process.pid if self._server is not None else None

    @property
    def root(self) -> str:
        """Where files of the mount really are (the backing directory, or the plain one)."""
        return self.backing if self.available or os.path.islink(self.mountpoint) else self.mountpoint

    def _hand_back(self, server: StandbyServer) -> None:
        """A server standing by that this mount no longer needs: to ``give_back``, or ended."""
        if self._give_back is not None:
            self._give_back(server)
        else:
            server.close()

    def _start(self, events_path: str | None, standby: StandbyServer | None) -> None:
        """Order ``standby`` to mount; one that died meanwhile is replaced by a new server
        (whose own failure, if any, is what ``wait_mounted`` reports)."""
        if standby is not None and self._order(standby, events_path):
            return
        self._order(StandbyServer(), events_path)

    def _order(self, server: StandbyServer, events_path: str | None) -> bool:
        """Whether ``server`` took its orders (it stays ours either way until replaced)."""
        if self._server is not None:
            self._server.close()
        self._server = server
        if not server.usable():
            return False
        try:
            server.mount(self.mountpoint, self.backing, self.fsname, events_path, self._log, self._answer)
            return True
        except LinkClosed:
            return False

    def _answer(self, op: str, args: dict[str, Any]) -> Any:
        if op == "mounted":
            self._mounted.set()
            return None
        if self._on_request is None:
            return None
        return self._on_request(op, args)

    def wait_mounted(self, timeout: float = MOUNT_TIMEOUT) -> None:
        """Until the server serves the mount point; ``RuntimeError`` with its log if it died."""
        if not self.available or self._mounted.is_set():
            return
        deadline = time.monotonic() + timeout
        server = self._server
        assert server is not None
        while not self._mounted.wait(0.02):
            if server.process.poll() is not None or time.monotonic() > deadline:
                self._fall_back(f"a mount that works (server exit {server.process.poll()}: {self._tail(server)})")
                return

    def _fall_back(self, missing: str) -> None:
        """The server could not mount: the job gets the backing directory as a plain one
        (the mount point becomes a link to it), and storage faults say what is missing."""
        import warnings

        self.close()
        self.closed = False
        self._server = None
        self.missing = missing
        os.rmdir(self.mountpoint)
        os.symlink(self.backing, self.mountpoint)
        warnings.warn(f"the harness filesystem did not mount; plain directories instead: {missing}",
                      RuntimeWarning, stacklevel=3)

    def _tail(self, server: StandbyServer) -> str:
        try:
            with open(self._log, errors="replace") as fp:
                logged = fp.read()[-2000:].strip()
        except OSError:
            logged = ""
        return logged or server.early_output()[-2000:] or "(no output)"

    def call(self, op: str, **args: Any) -> Any:
        """A control request to the server (``harness.sim.storage.server.StorageServer.control``)."""
        assert self._server is not None, "no storage server"
        self.wait_mounted()
        return self._server.link.call(op, **args)

    def close(self) -> None:
        """End the mount and make sure nothing stays mounted; safe to call twice. A server
        that unmounted cleanly goes to ``give_back`` (or is ended); one that did not is
        killed and its mount detached."""
        if self.closed:
            return
        self.closed = True
        server = self._server
        if server is None:
            return
        if self._mounted.is_set() and server.unmount():
            self._hand_back(server)
            return
        server.close()
        if any(point == self.mountpoint for point, _ in harness_mounts()):
            unmount(self.mountpoint)
