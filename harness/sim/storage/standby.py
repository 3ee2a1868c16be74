"""A filesystem server started before its job exists, so a job's launch does not wait for it.

Starting ``python -m harness.sim.storage.server`` costs about 70 ms (the interpreter, mfusepy
and libfuse): on a warm pool that was most of a small job's launch (0.20 s with the
filesystem against 0.11 s without). So a server always starts *standing by*: it imports
what it needs and waits on its control link for its orders (where to mount, what to serve,
where to log); ``StandbyServer.mount`` gives them. ``StandbyServer.unmount`` ends the job's
mount and the server stands by again, for the next job: a ``WarmPool`` keeps it between
jobs (``WarmPool.storage_server``, ``WarmPool.return_storage_server``), so back-to-back
jobs pay neither its start nor its imports' CPU. A job without one starts its own and
orders it at once, the same way.

Before its orders a standby writes to a pipe (an import that fails is read back from it:
``early_output``); its orders point its stdout and stderr at the job's log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from harness.sim.storage.link import Link, LinkClosed

__all__ = ["StandbyServer", "LIBRARY_ENV"]

#: mfusepy looks for libfuse 2 first (``find_library('fuse')``, 20 ms of ldconfig and gcc
#: probes when it is absent); the server needs libfuse 3, so it is named
LIBRARY_ENV = {"FUSE_LIBRARY_NAME": "fuse3"}


class StandbyServer:
    """A started server process and its control link, mounted once ``mount`` is called."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [sys.executable, "-m", "harness.sim.storage.server", "--control-fd", str(theirs.fileno()),
                   "--parent", str(os.getpid())]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                                        start_new_session=True, env={**os.environ, **LIBRARY_ENV})
        theirs.close()
        self._answer: Callable[[str, dict[str, Any]], Any] | None = None
        self._answer_lock = threading.Lock()
        self._released = threading.Event()  # also set when the link closes: a dead server is not waited for
        self.link = Link(ours, self._route, "storage", on_close=self._released.set)
        self.ordered = False

    def _route(self, op: str, args: dict[str, Any]) -> Any:
        if op == "released":
            self._released.set()
            return None
        with self._answer_lock:
            answer = self._answer
        return None if answer is None else answer(op, args)

    def usable(self) -> bool:
        """Alive, unordered, its link open: a job may take it."""
        return not self.ordered and self.process.poll() is None and not self.link.closed

    def mount(self, mountpoint: str, backing: str, fsname: str, events: str | None, log: str,
              answer: Callable[[str, dict[str, Any]], Any]) -> None:
        """Order the server to serve ``backing`` at ``mountpoint``; ``answer`` handles its
        requests from now on (``mounted``, ``file_event``). ``LinkClosed`` if it is gone."""
        with self._answer_lock:
            self._answer = answer
        self.ordered = True
        self._released.clear()
        try:
            self.link.call("mount", timeout=10.0, mountpoint=mountpoint, backing=backing, fsname=fsname,
                           events=events, log=log)
        except (TimeoutError, RuntimeError) as e:
            raise LinkClosed(f"the storage server took no orders: {e}") from None

    def unmount(self, timeout: float = 5.0) -> bool:
        """End the job's mount (SIGTERM: libfuse leaves its loop and unmounts); whether the
        server said it is standing by again (False: it died, or did not answer in time)."""
        if self.process.poll() is not None:
            return False
        os.kill(self.process.pid, signal.SIGTERM)
        if not self._released.wait(timeout) or self.link.closed or self.process.poll() is not None:
            return False  # no answer, or it died (a SIGKILLed one used to cost the whole timeout)
        with self._answer_lock:
            self._answer = None
        self.ordered = False
        return True

    def early_output(self) -> str:
        """What a server that died before its orders printed (empty while it runs)."""
        if self.process.poll() is None or self.process.stdout is None:
            return ""
        return self.process.stdout.read().decode(errors="replace").strip()

    def close(self) -> None:
        """Kill a server nobody took (a mounted one is ended by its ``StorageMount``)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.link.close()
        if self.process.stdout is not None:
            self.process.stdout.close()
