"""A command running on a host: the local ``ssh`` client that carries it, and the pipe that
keeps it alive.

The client's stdin is a pipe whose write end only this process holds (``os.pipe`` fds are
close-on-exec: no other child inherits it). It is the command's lifeline: the remote
supervisor (``_remote.run``) ends the command's process group when the pipe reaches EOF,
and the pipe reaches EOF when we close it *or when this process dies*, however it dies:
the kernel closes its fds. So a controller killed with SIGKILL still ends its remote
commands, with no PDEATHSIG (which would fire when the *thread* that started ssh exits,
not the process) and no timer. Lines written to it (``signal N``, ``tree N``) ask the
supervisor to signal the group, or every process below the command: faults carried out on
the host. Two are questions (``pid Q PID N``: one process below the command, never any
other; ``stopped Q MS``), whose answers come back over the connection's lease
(``LeaseChannel.ask``): the command's own stdout is the command's.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from harness.hosts._errors import HostError, HostTimeout

if TYPE_CHECKING:
    from harness.hosts._clock import LeaseChannel

__all__ = ["CommandResult", "RemoteProcess", "show_argv", "stop_local"]

_log = logging.getLogger(__name__)

#: after the remote group was told to stop, how much longer the local client may take to
#: report its exit before it is killed here (one round trip plus the supervisor's exit)
_LOCAL_SLACK_S = 5.0


@dataclass(frozen=True)
class CommandResult:
    """A finished remote command. ``returncode`` is the command's status (128+N when signal
    N killed it, as a shell says); 255 is the ssh client's own failure."""

    host: str
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def show_argv(argv: Sequence[str]) -> str:
    """``argv`` as one line for a message: an argument with a newline or over 80 characters
    (a program given with ``-c``) is cut to its first 40."""
    return shlex.join(arg if "\n" not in arg and len(arg) <= 80 else " ".join(arg.split())[:40] + "..."
                      for arg in argv)


def stop_local(popen: subprocess.Popen[str], grace: float) -> int:
    """Wait up to ``grace`` s for a local ssh process to exit by itself (it was told to, or
    its lifeline closed), then SIGTERM -> 1 s -> SIGKILL; always reaped. Its status."""
    for sig, wait in ((None, grace), (signal.SIGTERM, 1.0)):
        if sig is not None and popen.poll() is None:
            popen.send_signal(sig)
        try:
            return popen.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    _log.warning("ssh pid %d ignored SIGTERM for 1 s: killed (a hung connection? ServerAliveInterval ends "
                 "those; run its command line, SshHost.ssh_argv(), by hand to see what ssh says)", popen.pid)
    popen.kill()
    return popen.wait()


class RemoteProcess:
    """``SshHost.start(argv)``'s handle. ``stdout``/``stderr`` are the remote command's
    (text pipes); ``pid`` is the local ssh client's. ``terminate()`` or ``close()`` it."""

    def __init__(self, host: str, argv: Sequence[str], popen: subprocess.Popen[str], lifeline: int,
                 grace: float, lease: LeaseChannel | None = None, connection: int = 0):
        self.host, self.argv, self.grace = host, tuple(argv), grace
        self.popen = popen
        self.connection = connection  # which of its host's connections its session is on
        self._lifeline: int | None = lifeline
        self._lease = lease  # where the supervisor's answers come back (None: no questions)
        self.closed = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> IO[str] | None:
        return self.popen.stdout

    @property
    def stderr(self) -> IO[str] | None:
        return self.popen.stderr

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def first_line(self, timeout: float) -> str:
        """The command's first stdout line, as soon as it is written; "" if the command
        ended, or said nothing for ``timeout`` s. For a command that says it is ready in
        one line (a cgroup keeper, a storage server's "listening"): only before any other
        read of its stdout (a line already in the pipe's buffer is not waited for)."""
        assert self.popen.stdout is not None, "first_line() needs the command's stdout piped"
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        return self.popen.stdout.readline() if ready else ""

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise HostTimeout(f"host {self.host}: {self._shown()} still running after {timeout:g} s") from None

    def communicate(self, timeout: float) -> tuple[str, str]:
        """Its whole stdout and stderr once it exits (the lifeline stays open meanwhile)."""
        try:
            out, err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostTimeout(f"host {self.host}: {self._shown()} did not finish within {timeout:g} s") from None
        return out or "", err or ""

    def send_signal(self, sig: int) -> None:
        """Signal the command's process group on the host (a no-op once it was let go)."""
        if self._lifeline is not None:
            try:
                os.write(self._lifeline, f"signal {int(sig)}\n".encode())
            except BrokenPipeError:  # the client is gone: so is the command
                pass

    def signal_tree(self, sig: int) -> None:
        """Signal every process the command started on the host, each one whatever its
        process group, then the command's group (a no-op once it was let go)."""
        if self._lifeline is not None:
            try:
                os.write(self._lifeline, f"tree {int(sig)}\n".encode())
            except BrokenPipeError:
                pass

    def signal_pid(self, pid: int, sig: int, timeout: float = 10.0) -> bool:
        """``sig`` to process ``pid`` of the host, only if it is a process below the
        command (its supervisor checks there, and signals it there: never a process the
        command did not start). True: signalled; False: no such process below it now (it
        ended, or the command did). ``HostError`` when ``pid`` is any other process of the
        host: nothing is signalled. ``HostTimeout`` with no answer within ``timeout`` s."""
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise ValueError(f"pid={pid!r} must be a process id (an int > 0)")
        answer = self._ask(f"pid {{}} {pid} {int(sig)}", timeout, f"signal {int(sig)} to pid {pid}")
        if answer is None or answer.get("result") == "gone":
            return False
        if answer.get("result") == "signalled":
            return True
        raise HostError(f"host {self.host}: signal {int(sig)} to pid {pid} refused: {answer.get('why')}; "
                        "nothing was signalled")

    def await_stopped(self, timeout: float) -> str:
        """Until the command's process is stopped (SIGSTOP reached it) or ended, at most
        ``timeout`` s (waited for on the host, by its supervisor): ``"stopped"``,
        ``"exited"``, or ``"running"``."""
        answer = self._ask(f"stopped {{}} {max(0, round(timeout * 1000))}", timeout + _LOCAL_SLACK_S,
                           "whether the command stopped")
        result = "exited" if answer is None else answer.get("result")
        return result if result in ("stopped", "exited") else "running"

    def _ask(self, question: str, timeout: float, what: str) -> dict[str, object] | None:
        """``question`` (with ``{}`` for its number) to the supervisor; its answer, None
        when the command was let go or is gone."""
        if self._lease is None:
            raise HostError(f"host {self.host}: {self._shown()} takes no questions (started without the lease)")

        def send(number: int) -> bool:
            if self._lifeline is None:
                return False
            try:
                os.write(self._lifeline, (question.format(number) + "\n").encode())
            except BrokenPipeError:
                return False
            return True

        try:  # the local client ends when the supervisor does: then no answer is coming
            gone: int | None = os.pidfd_open(self.popen.pid) if self.popen.poll() is None else None
        except (AttributeError, OSError):  # reaped meanwhile, or no pidfds: the timeout alone
            gone = None
        if gone is None and self.popen.returncode is not None:
            return None
        try:
            return self._lease.ask(send, timeout, f"{what} ({self._shown()})", gone)
        finally:
            if gone is not None:
                os.close(gone)

    def let_go(self) -> None:
        """Close the lifeline: the host terminates the group, then kills it after ``grace``."""
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            os.close(fd)

    def terminate(self) -> int:
        """End it (terminate -> grace -> kill, on the host), reap the client; its status."""
        self.let_go()
        return stop_local(self.popen, self.grace + _LOCAL_SLACK_S)

    def close(self) -> None:
        """``terminate()`` if it runs, and close the pipes."""
        self.closed = True
        self.terminate()
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()

    def _shown(self) -> str:
        return show_argv(self.argv)

    def __repr__(self) -> str:
        code = self.popen.poll()
        state = f"exited {code}" if code is not None else "running" if self._lifeline is not None else "stopping"
        return f"<RemoteProcess {self.host} {self._shown()!r} ssh pid={self.pid} {state}>"
