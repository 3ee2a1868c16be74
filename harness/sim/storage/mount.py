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
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.procs import process_state
from harness.sim.storage.link import Link

__all__ = ["StorageMount", "fuse_missing", "FUSE_ENV", "sweep", "harness_mounts", "unmount", "FSNAME_PREFIX"]

FSNAME_PREFIX = "harness-"  # fsname harness-<owner pid>-<job>: the owner is in the name
SUBTYPE = "harness"
MOUNT_TIMEOUT = 15.0
FUSE_ENV = "HARNESS_FUSE"


def fuse_missing() -> str | None:
    """What this machine lacks for the harness's filesystem (None: nothing).
    ``HARNESS_FUSE=0`` in the environment turns it off (plain directories)."""
    if os.environ.get(FUSE_ENV, "1") == "0":
        return f"FUSE, turned off here ({FUSE_ENV}=0)"
    return _machine_lacks()


@functools.lru_cache(maxsize=1)
def _machine_lacks() -> str | None:
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as e:
        return f"/dev/fuse ({e.strerror}; a container needs --device /dev/fuse)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse)
    except ImportError as e:
        return f"the mfusepy package (pip install mfusepy: {e})"
    except OSError as e:
        return f"libfuse 3 (apt-get install fuse3: {e})"
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
                 on_request: Callable[[str, dict[str, Any]], Any] | None = None):
        self.mountpoint = os.path.join(directory, "fs")
        self.backing = os.path.join(directory, "backing")
        os.makedirs(self.mountpoint)
        os.makedirs(self.backing)
        self.missing = fuse_missing()
        self.fsname = f"{FSNAME_PREFIX}{os.getpid()}-{name}"
        self._on_request = on_request
        self._mounted = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._link: Link | None = None
        self._log = os.path.join(directory, "storage.log")
        self.closed = False
        if self.missing is None:
            sweep()
            self._start(events_path)

    @property
    def available(self) -> bool:
        """Whether ``mountpoint`` is served by the harness (False: a plain directory)."""
        return self._process is not None

    @property
    def server_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def root(self) -> str:
        """Where files of the mount really are (the backing directory, or the plain one)."""
        return self.backing if self.available or os.path.islink(self.mountpoint) else self.mountpoint

    def _start(self, events_path: str | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [sys.executable, "-m", "harness.sim.storage.server", "--mount", self.mountpoint,
                   "--backing", self.backing, "--fsname", self.fsname, "--control-fd", str(theirs.fileno()),
                   "--parent", str(os.getpid())]
        if events_path is not None:
            command += ["--events", events_path]
        with open(self._log, "ab") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self._link = Link(ours, self._answer, "storage")

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
        process = self._process
        assert process is not None
        while not self._mounted.wait(0.02):
            if process.poll() is not None or time.monotonic() > deadline:
                self._fall_back(f"a mount that works (server exit {process.poll()}: {self._tail()})")
                return

    def _fall_back(self, missing: str) -> None:
        """The server could not mount: the job gets the backing directory as a plain one
        (the mount point becomes a link to it), and storage faults say what is missing."""
        import warnings

        self.close()
        self.closed = False
        self._process = None
        self.missing = missing
        os.rmdir(self.mountpoint)
        os.symlink(self.backing, self.mountpoint)
        warnings.warn(f"the harness filesystem did not mount; plain directories instead: {missing}",
                      RuntimeWarning, stacklevel=3)

    def _tail(self) -> str:
        try:
            with open(self._log, errors="replace") as fp:
                return fp.read()[-2000:].strip() or "(no output)"
        except OSError:
            return "(no log)"

    def call(self, op: str, **args: Any) -> Any:
        """A control request to the server (``harness.sim.storage.server.StorageServer.control``)."""
        assert self._link is not None, "no storage server"
        self.wait_mounted()
        return self._link.call(op, **args)

    def close(self) -> None:
        """End the server and make sure nothing stays mounted; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)  # libfuse leaves its loop and unmounts
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        if any(point == self.mountpoint for point, _ in harness_mounts()):
            unmount(self.mountpoint)
        if self._link is not None:
            self._link.close()
