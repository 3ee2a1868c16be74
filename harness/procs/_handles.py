"""One worker process: start it, learn when it exits, signal its process group.

Every worker leads its own process group so a signal reaches its children too, and has
PDEATHSIG=SIGKILL so it dies with the agent (torch's workers are orphaned). A program gets
a session of its own too, as torch's do; a callable stays in the agent's session, as
torch's multiprocessing workers stay in torchrun's (why: ``_run_callable``).
Exit is *observed* through a file descriptor (pidfd, or multiprocessing's sentinel) so
the agent can block on many workers at once instead of polling. Before a worker is
reaped its group is swept with SIGKILL: while the leader is an unreaped zombie the group
id cannot be reused, so the sweep can never hit a stranger.
"""

from __future__ import annotations

import abc
import os
import pickle
import signal
import subprocess
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import IO, Any, cast

from harness.procs._exit import exit_like_python
from harness.procs._prctl import die_with_parent

__all__ = ["WorkerProcess", "BinaryProcess", "CallableProcess", "process_state", "process_start_time",
           "is_same_process", "signal_process_group"]


# /proc/<pid>/stat is read by hand here, not with psutil, on purpose: these run in every
# agent, and importing psutil costs an agent 25-75 ms (python -X importtime, this 2-core
# machine) of a ~0.2 s start -- 32 simulated nodes pay it 32 times; one read is ~50 us
# against psutil's ~120 us. The simulation and the plugin, which import psutil anyway, use it.


def process_state(pid: int) -> str | None:
    """The one-letter state from /proc (R, S, D, T, Z...), None if the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3].decode()


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot, /proc field 22): with the pid, a process identity
    that survives pid reuse. None if the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[19])


def is_same_process(pid: int, start_time: int | None) -> bool:
    """True if ``pid`` still names the process that had ``start_time``."""
    return start_time is not None and process_start_time(pid) == start_time


def signal_process_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads; to ``pid`` alone when it leads none (a
    callable worker before its setpgid); nothing when it is gone. Callers make sure ``pid``
    cannot have been reused (unreaped child, or checked start time)."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited_unreaped(pid: int) -> bool:
    """True once ``pid`` (our child) has exited; leaves it unreaped (WNOWAIT)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid == pid


class WorkerProcess(abc.ABC):
    """A started worker. ``fileno()`` turns readable when the process exits."""

    _sweep_safe = True  # False where someone else reaps the process (forkserver)

    def __init__(self, local_rank: int, pid: int):
        self.local_rank = local_rank
        self.pid = pid
        self.exitcode: int | None = None

    @abc.abstractmethod
    def fileno(self) -> int: ...

    @abc.abstractmethod
    def _reap(self) -> int:
        """Collect the exit status of an exited process (negative = killed by signal)."""

    def _has_exited(self) -> bool:
        """True once the process exited; must not reap it (see the module docstring)."""
        return _exited_unreaped(self.pid)

    def poll(self) -> int | None:
        """The exit code if the worker has exited (reaping it), else None."""
        if self.exitcode is None and self._has_exited():
            if self._sweep_safe:
                signal_process_group(self.pid, signal.SIGKILL)  # sweep leftovers before the reap
            self.exitcode = self._reap()
        return self.exitcode

    def signal_group(self, sig: int) -> None:
        if self.exitcode is None:
            signal_process_group(self.pid, sig)

    return_path: str | None = None  # where a callable worker pickles its return value

    def return_value(self) -> Any:
        if self.return_path is None:
            return None
        try:
            with open(self.return_path, "rb") as fp:
                return pickle.load(fp)
        except FileNotFoundError:
            return None

    def release(self) -> None:
        """Close descriptors; call once the process is reaped."""

    def __repr__(self) -> str:
        state = "running" if self.exitcode is None else f"exited {self.exitcode}"
        return f"{type(self).__name__}(local_rank={self.local_rank}, pid={self.pid}, {state})"


def _preexec(agent_pid: int) -> Callable[[], None]:
    def setup() -> None:
        die_with_parent(agent_pid)

    return setup


class BinaryProcess(WorkerProcess):
    """A program run with ``Popen``; stdout/stderr are a file, a pipe, or inherited."""

    def __init__(self, local_rank: int, argv: list[str], env: dict[str, str],
                 stdout: IO[Any] | int | None, stderr: IO[Any] | int | None, cwd: str | None = None):
        self._popen = subprocess.Popen(
            argv,
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_preexec(os.getpid()),
            close_fds=True,
        )
        super().__init__(local_rank, self._popen.pid)
        self._pidfd = os.pidfd_open(self.pid)

    def fileno(self) -> int:
        return self._pidfd

    def _reap(self) -> int:
        code = self._popen.wait()
        return code

    def release(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


# ----------------------------------------------------------------------------------------
# callables


def _run_callable(payload: dict[str, Any]) -> None:
    """Body of a callable worker's process (runs in the child)."""
    # forkserver children are the server's, which itself dies with the agent
    die_with_parent(payload["agent_pid"] if payload["direct_child"] else os.getppid())
    # a process group of its own (the agent signals it with its children as one), but the
    # agent's session, as torch's multiprocessing workers stay in torchrun's: a session of
    # its own would also be a scheduler autogroup of its own, and a worker in one lost about
    # a third of --run-path runs to torch's exit race (tests/scripts/no_destroy.py)
    os.setpgid(0, 0)
    os.environ.update(payload["env"])
    from harness.procs._stackdump import install_from_env

    install_from_env(os.environ)  # SIGUSR1 -> Python stacks, when the plugin asks
    for fd, target in ((1, payload["stdout"]), (2, payload["stderr"])):
        if target is None:
            continue
        if isinstance(target, str):
            new = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        else:  # a multiprocessing Connection wrapping a pipe's write end
            new = os.dup(target.fileno())
            target.close()
        os.dup2(new, fd)
        os.close(new)
    from harness.errors import record

    result = record(payload["fn"])(*payload["args"])
    tmp = payload["return_path"] + ".tmp"
    with open(tmp, "wb") as fp:
        pickle.dump(result, fp)
    os.replace(tmp, payload["return_path"])
    # and no Py_FinalizeEx, where torch's exit race lives (harness.procs._exit), as after
    # fork and forkserver (multiprocessing ends those children with os._exit) and the zygote
    exit_like_python(0)


class CallableProcess(WorkerProcess):
    """A function run in a child started by ``multiprocessing`` (spawn, fork, forkserver)."""

    def __init__(self, local_rank: int, ctx: Any, fn: Callable[..., Any], args: tuple[Any, ...],
                 env: dict[str, str], stdout: Any, stderr: Any, return_path: str):
        self.return_path = return_path
        self._direct_child = self._sweep_safe = ctx.get_start_method() != "forkserver"
        payload = {"agent_pid": os.getpid(), "direct_child": self._direct_child, "fn": fn, "args": args, "env": env,
                   "stdout": stdout, "stderr": stderr, "return_path": return_path}
        self._process: BaseProcess = ctx.Process(target=_run_callable, args=(payload,), daemon=False,
                                    name=f"worker-{local_rank}")
        self._process.start()
        super().__init__(local_rank, self._process.pid)

    def fileno(self) -> int:
        return self._process.sentinel

    def _has_exited(self) -> bool:
        if self._direct_child:
            return _exited_unreaped(self.pid)
        return self._process.exitcode is not None  # the forkserver reaps it for us

    def _reap(self) -> int:
        self._process.join()
        return cast(int, self._process.exitcode)  # joined: it has exited, so the code is set

    def release(self) -> None:
        self._process.close()
