"""A node's worker processes for one attempt: start, wait on exits, collect, stop."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, BinaryIO, NamedTuple

from harness.errors import ERROR_FILE_ENV, ProcessFailure
from harness.procs._cgroup import OOM_REASON, OomLedger
from harness.procs._handles import BinaryProcess, CallableProcess, WorkerProcess, process_state
from harness.procs._logs import AttemptLogs, RankLogs
from harness.procs._placement import place_worker, worker_cgroup_files, worker_nice
from harness.procs._std import Std
from harness.procs._tee import TeePump, TeeSink

if TYPE_CHECKING:
    from harness.procs._zygote_client import Zygote

__all__ = ["RunProcsResult", "ProcessContext", "START_METHODS", "Wakeup"]

log = logging.getLogger(__name__)

START_METHODS = ("spawn", "fork", "forkserver", "zygote")
_KILL_WAIT = 5.0  # after SIGKILL: how long to wait for the kernel before giving up


class Wakeup(NamedTuple):
    """Why ``ProcessContext.wait`` returned: which of the caller's fds are readable, and
    whether a worker exited. Neither: the timeout passed with nothing new, and a caller
    whose last look found everything well need not look again (nothing it polls moved)."""

    fds: frozenset[int]
    worker_exited: bool

    @property
    def quiet(self) -> bool:
        return not self.fds and not self.worker_exited


@dataclass
class RunProcsResult:
    """Return values (all succeeded) or failures (someone failed), keyed by local rank."""

    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return bool(self.failures)


class ProcessContext:
    """Starts ``len(envs)`` workers of one entrypoint and supervises them as a unit.

    ``envs`` are complete environments (binaries get exactly that; callables apply it on
    top of what they inherit).
    """

    def __init__(self, name: str, entrypoint: Callable[..., Any] | str, args: dict[int, tuple[Any, ...]],
                 envs: dict[int, dict[str, str]], logs: AttemptLogs, start_method: str = "spawn",
                 zygote: Zygote | None = None):
        self.name = name
        self.entrypoint = entrypoint
        self.args = args
        self.envs = envs
        self.logs = logs
        self.start_method = start_method
        self._zygote = zygote
        self.procs: dict[int, WorkerProcess] = {}
        self._pump: TeePump | None = None
        self._files: list[IO[Any]] = []
        self._selector = selectors.DefaultSelector()
        self._extra: tuple[int, ...] = ()  # the caller's fds, registered in it between waits
        self._oom: OomLedger | None = None

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        self._oom = OomLedger()  # before any worker runs: its OOM kills count from here
        # the agent runs before its workers when its environment asks (_placement)
        nice, cgroups = worker_nice(), worker_cgroup_files()
        try:
            for local_rank in sorted(self.envs):
                proc = self._start_one(local_rank)
                self.procs[local_rank] = proc
                for problem in place_worker(proc.pid, nice, cgroups):
                    log.warning("%s", problem)
                self._oom.watch(proc.pid)
                self._selector.register(proc.fileno(), selectors.EVENT_READ, proc)
        except BaseException:
            self.close(signal.SIGKILL, grace=0)
            raise

    def _console(self, stream: int) -> BinaryIO:
        return sys.stdout.buffer if stream == 1 else sys.stderr.buffer

    def _stream(self, rank_logs: RankLogs, which: Std) -> tuple[Any, tuple[int, TeeSink] | None]:
        """What a worker's stdout/stderr is given, and a pipe to pump if tee'd."""
        path = rank_logs.stdout_file if which == Std.OUT else rank_logs.stderr_file
        if path is None:
            return (None if rank_logs.console else subprocess.DEVNULL), None
        file = open(path, "wb")
        if not rank_logs.tee & which:
            return file, None
        self._files.append(file)
        read_fd, write_fd = os.pipe()
        console = self._console(1 if which == Std.OUT else 2) if rank_logs.console else None
        sink = TeeSink(file=file, console=console, prefix=rank_logs.prefix.encode())
        return write_fd, (read_fd, sink)

    def _start_one(self, local_rank: int) -> WorkerProcess:
        rank_logs = self.logs.ranks[local_rank]
        env = dict(self.envs[local_rank])
        env[ERROR_FILE_ENV] = rank_logs.error_file
        stdout, out_pipe = self._stream(rank_logs, Std.OUT)
        stderr, err_pipe = self._stream(rank_logs, Std.ERR)
        try:
            proc = self._launch(local_rank, env, stdout, stderr)
        finally:
            for handle in (stdout, stderr):
                if isinstance(handle, int) and handle >= 0:
                    os.close(handle)
                elif hasattr(handle, "close") and handle not in self._files:
                    handle.close()
        for pipe in (out_pipe, err_pipe):
            if pipe is not None:
                if self._pump is None:
                    self._pump = TeePump()
                self._pump.add(*pipe)
        return proc

    def _launch(self, local_rank: int, env: dict[str, str], stdout: Any, stderr: Any) -> WorkerProcess:
        args = self.args[local_rank]
        if isinstance(self.entrypoint, str):
            argv = [self.entrypoint, *map(str, args)]
            if self.start_method == "zygote" and self._zygote is not None:
                return self._zygote.start_worker(local_rank, argv, env, stdout, stderr)
            return BinaryProcess(local_rank, argv, env, stdout, stderr)
        return_path = os.path.join(self.logs.ranks[local_rank].directory, "return.pkl")
        if self.start_method == "zygote" and self._zygote is not None:
            payload = os.path.join(self.logs.ranks[local_rank].directory, "call.pkl")
            with open(payload, "wb") as fp:
                pickle.dump((self.entrypoint, args, return_path), fp)
            return self._zygote.start_callable(local_rank, payload, env, stdout, stderr)
        ctx = multiprocessing.get_context(self.start_method)
        streams = [_child_stream(stdout), _child_stream(stderr)]
        try:
            return CallableProcess(local_rank, ctx, self.entrypoint, args, env,
                                   streams[0], streams[1], return_path)
        finally:
            for stream in streams:
                if hasattr(stream, "close"):
                    stream.close()  # the child has its own copy now

    # -- watch ---------------------------------------------------------------------------

    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self.procs.items()}

    def wait(self, timeout: float, extra_fds: tuple[int, ...] = ()) -> Wakeup:
        """Block until some worker exits, an ``extra_fds`` turns readable, or ``timeout``
        passes; which of ``extra_fds`` are readable, and whether a worker exited (with no
        worker left to watch: at once, every extra fd named, unwaited: the caller looks
        at everything then).

        The extra fds stay registered from one wait to the next while they are the same:
        the agent waits ten times a second, and registering and unregistering them each
        time was four of an idle wait's six system calls."""
        self._watch_extra(extra_fds)
        if len(self._selector.get_map()) <= len(self._extra):
            return Wakeup(frozenset(extra_fds), True)
        events = self._selector.select(timeout=max(0.0, timeout))
        fds = frozenset(key.fd for key, _ in events if key.data is None)
        return Wakeup(fds, len(fds) < len(events))

    def _watch_extra(self, fds: tuple[int, ...]) -> None:
        if fds == self._extra:
            return
        for fd in self._extra:
            if fd not in fds:
                try:
                    self._selector.unregister(fd)
                except (KeyError, ValueError):
                    pass
        for fd in fds:
            if fd not in self._extra:
                self._selector.register(fd, selectors.EVENT_READ, None)
        self._extra = fds

    def poll(self) -> RunProcsResult | None:
        """None while any worker runs and none failed; else the result."""
        failures: dict[int, ProcessFailure] = {}
        running = False
        for rank, proc in self.procs.items():
            code = proc.poll()
            if code is None:
                running = True
                continue
            self._unwatch(proc)
            if code != 0:
                failures[rank] = failure = ProcessFailure(rank, proc.pid, code,
                                                          self.logs.ranks[rank].error_file)
                if self.exit_reason(rank) == OOM_REASON:
                    assert self._oom is not None
                    failure.message = self._oom.describe(proc.pid)  # not a bare "Signal 9"
        if failures:
            return RunProcsResult(failures=failures)
        if running:
            return None
        return RunProcsResult(
            return_values={rank: proc.return_value() for rank, proc in self.procs.items()})

    def exit_reason(self, local_rank: int) -> str | None:
        """Why worker ``local_rank`` ended, where the exit code does not say it: ``"oom"``
        if the kernel's OOM killer took it (``harness.procs._cgroup``); else None."""
        proc = self.procs[local_rank]
        if self._oom is not None and self._oom.killed_by_oom(proc.pid, proc.exitcode):
            return OOM_REASON
        return None

    def uninterruptible(self, since: dict[int, float], timeout: float) -> list[int]:
        """Local ranks that have been in D state for longer than ``timeout`` seconds."""
        now = time.monotonic()
        stuck = []
        for rank, proc in self.procs.items():
            if proc.exitcode is None and process_state(proc.pid) == "D":
                since.setdefault(rank, now)
                if now - since[rank] >= timeout:
                    stuck.append(rank)
            else:
                since.pop(rank, None)
        return stuck

    def _unwatch(self, proc: WorkerProcess) -> None:
        try:
            self._selector.unregister(proc.fileno())
        except (KeyError, ValueError):
            pass

    # -- stop ----------------------------------------------------------------------------

    def close(self, death_sig: int = signal.SIGTERM, grace: float = 30.0) -> list[int]:
        """terminate -> grace -> kill -> reap every worker; returns pids that would not die."""
        live = [p for p in self.procs.values() if p.poll() is None]
        for proc in live:
            proc.signal_group(death_sig)
        if live and grace > 0:
            self._wait_all(live, time.monotonic() + grace)
        stubborn = [p for p in live if p.poll() is None]
        for proc in stubborn:
            log.warning("worker %s ignored %s for %.1fs; sending SIGKILL", proc,
                        signal.Signals(death_sig).name, grace)
            proc.signal_group(signal.SIGKILL)
        if stubborn:
            self._wait_all(stubborn, time.monotonic() + _KILL_WAIT)
        unkillable = [p.pid for p in stubborn if p.poll() is None]
        for pid in unkillable:
            log.error("worker pid %d did not die %.0fs after SIGKILL (uninterruptible I/O?); "
                      "leaving it behind", pid, _KILL_WAIT)
        for proc in self.procs.values():
            if proc.exitcode is not None:
                self._unwatch(proc)
                proc.release()
        if self._pump is not None:
            self._pump.close()
            self._pump = None
        for file in self._files:
            file.close()
        self._files.clear()
        self._selector.close()
        self._selector = selectors.DefaultSelector()
        self._extra = ()
        return unkillable

    def _wait_all(self, procs: list[WorkerProcess], deadline: float) -> None:
        pending = [p for p in procs if p.poll() is None]
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            with selectors.DefaultSelector() as sel:
                for proc in pending:
                    sel.register(proc.fileno(), selectors.EVENT_READ)
                sel.select(timeout=remaining)
            pending = [p for p in pending if p.poll() is None]

    def __repr__(self) -> str:
        return (f"ProcessContext(name={self.name!r}, start_method={self.start_method}, "
                f"procs={list(self.procs.values())})")


def _child_stream(handle: Any) -> Any:
    """Turn what ``_stream`` made into something a multiprocessing child can receive."""
    if handle is None or handle == subprocess.DEVNULL:
        return os.devnull if handle == subprocess.DEVNULL else None
    if isinstance(handle, int):
        from multiprocessing.connection import Connection

        return Connection(os.dup(handle), readable=False)
    return handle.name  # a file opened for redirect: the child reopens it by path
