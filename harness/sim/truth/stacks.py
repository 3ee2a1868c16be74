"""The Python stacks of a job's live workers, on demand: what a hang is named with.

Workers install ``faulthandler`` for ``SIGUSR1`` when ``HARNESS_STACK_DUMP_DIR`` is in their
environment (``harness.procs.STACKS_ENV``: the zygote's forked child and a callable's child
do it; a spawned script runs nothing of ours first, so it has no handler). Here we signal
each live worker that has its dump file, wait until what it appended holds still, and
collect it. A stopped worker (``hang_worker``, ``freeze_node``) is continued for the dump
and stopped again, so the job stays as it was. Workers without the handler are listed with
their state only, never signalled: SIGUSR1's default action would kill them.

A node on a host is asked the same way through its connection (``WorkerAccess``: its
workers' states and dump files read there, its signals sent by the agent's supervisor, which
signals only processes below the agent): a hang is named with its stacks wherever it runs.

Used by ``Job.wait`` when it names a hang (``harness.sim.truth.hangs``) and by the pytest plugin
when a test times out (``pytest_elastic._timeout``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from harness.procs import STACKS_ENV

if TYPE_CHECKING:
    from harness.sim.truth.subject import StackedJob

__all__ = ["DUMP_WAIT_S", "NO_WORKERS", "STATES", "LocalWorkers", "WorkerAccess", "all_stacks", "host_stacks",
           "host_workers", "job_workers", "joined", "worker_stacks"]

DUMP_WAIT_S = 3.0
#: psutil's names of /proc's one-letter states, which a host answers with
STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop", "Z": "zombie",
          "X": "dead", "I": "idle", "P": "parked", "W": "waking", "K": "wake-kill"}


class WorkerAccess(Protocol):
    """How the workers of some nodes are reached: here (``LocalWorkers``), or on their host
    (``harness.sim.places.hosts.nodes``, over its SSH connection). ``worker_stacks`` asks through
    it, so a hang is named with its stacks wherever its node runs."""

    def states(self, pids: Sequence[int]) -> dict[int, str]:
        """pid -> its state as psutil names it; a pid that is gone is left out."""
        ...

    def dump_file(self, pid: int) -> str | None:
        """Where worker ``pid`` appends its stacks (None: no dump dir known)."""
        ...

    def sizes(self, paths: Sequence[str]) -> dict[str, int]:
        """path -> its size; a missing file is left out."""
        ...

    def signal(self, pid: int, sig: int) -> bool:
        """``sig`` to worker ``pid``; False when it is gone."""
        ...

    def read(self, path: str, offset: int) -> str:
        """What ``path`` holds from ``offset`` on ("" when it cannot be read)."""
        ...


class LocalWorkers:
    """This machine's workers, their dumps in ``stacks_dir``."""

    def __init__(self, stacks_dir: str | None):
        self.stacks_dir = stacks_dir

    def states(self, pids: Sequence[int]) -> dict[int, str]:
        import psutil

        states = {}
        for pid in pids:
            try:
                states[pid] = str(psutil.Process(pid).status())
            except psutil.Error:
                pass
        return states

    def dump_file(self, pid: int) -> str | None:
        return os.path.join(self.stacks_dir, f"{pid}.txt") if self.stacks_dir else None

    def sizes(self, paths: Sequence[str]) -> dict[str, int]:
        sizes = {}
        for path in paths:
            try:
                sizes[path] = os.path.getsize(path)
            except OSError:
                pass
        return sizes

    def signal(self, pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def read(self, path: str, offset: int) -> str:
        try:
            with open(path, errors="replace") as fp:
                fp.seek(offset)
                return fp.read()
        except OSError:
            return ""


def job_workers(job: StackedJob, label: str = "", nodes: Iterable[int] | None = None) -> Iterator[tuple[str, int]]:
    """(label, pid) of every live worker of ``job``'s nodes here (of ``nodes`` only, when
    given); a node's on a host are ``host_workers``'."""
    for index in sorted(job.nodes if nodes is None else nodes):
        if job.nodes[index].worker_access() is None:
            yield from _labelled(job, index, label)


def host_workers(job: StackedJob, label: str = "",
                 nodes: Iterable[int] | None = None) -> Iterator[tuple[WorkerAccess, list[tuple[str, int]]]]:
    """(how to reach them, [(label, pid)]) of the live workers of each of ``job``'s nodes
    on a host (of ``nodes`` only): their pids are the host's, reached through its connection."""
    for index in sorted(job.nodes if nodes is None else nodes):
        access = job.nodes[index].worker_access()
        if access is not None:
            workers = list(_labelled(job, index, label))
            if workers:
                yield access, workers


def all_stacks(job: StackedJob, stacks_dir: str | None, label: str = "", nodes: Iterable[int] | None = None,
               wait: float = DUMP_WAIT_S, agents: Iterable[int] = ()) -> str:
    """The stacks of the live workers of ``job``'s nodes (``nodes`` only), here and on hosts,
    and of the agents of ``agents`` here, asked together and waited for once: where a node
    with no live worker is stuck is its agent's own code (the agent shows its stacks on
    ``SIGUSR1`` as its workers do, ``harness.procs.STACKS_ENV``). An agent on a host is not
    asked: its supervisor signals only what runs below it."""
    chosen = sorted(job.nodes if nodes is None else nodes)
    here = [*job_workers(job, label, chosen),
            *((f"{label}node {index} ({job.node_name(index)}) agent pid {job.nodes[index].pid}", job.nodes[index].pid)
              for index in sorted(agents) if job.nodes[index].worker_access() is None)]
    return joined([worker_stacks(here, stacks_dir, wait), *host_stacks(job, label, chosen, wait)])


def host_stacks(job: StackedJob, label: str = "", nodes: Iterable[int] | None = None,
                wait: float = DUMP_WAIT_S) -> list[str]:
    """The stacks of the live workers of each of ``job``'s nodes on a host, read there."""
    return [worker_stacks(workers, None, wait, access) for access, workers in host_workers(job, label, nodes)]


def joined(texts: Iterable[str]) -> str:
    """``worker_stacks`` texts as one: those with workers, or ``NO_WORKERS`` when none has."""
    found = [text for text in texts if text != NO_WORKERS]
    return "\n".join(found) if found else NO_WORKERS


def _labelled(job: StackedJob, index: int, label: str) -> Iterator[tuple[str, int]]:
    name = job.node_name(index)
    ranks = {e["local_rank"]: e.get("rank") for e in job.timeline.events("worker_start", index)}
    for local_rank, pid in sorted(job.worker_pids(index).items()):
        yield (f"{label}node {index} ({name}) local_rank {local_rank} rank {ranks.get(local_rank)} "
               f"pid {pid}", pid)


NO_WORKERS = "(no live workers)"


def worker_stacks(workers: Iterable[tuple[str, int]], stacks_dir: str | None,
                  wait: float = DUMP_WAIT_S, access: WorkerAccess | None = None) -> str:
    """Ask each (label, pid) worker for its Python stacks; the collected text, worker by
    worker (a note in place of a stack where there is none to be had). ``access``: how they
    are reached (default: here, their dumps in ``stacks_dir``)."""
    reach: WorkerAccess = access if access is not None else LocalWorkers(stacks_dir)
    workers = list(workers)
    states = reach.states([pid for _, pid in workers])
    files = {pid: reach.dump_file(pid) for pid in states}
    sizes = reach.sizes([path for path in files.values() if path])
    blocks: list[tuple[str, int | None]] = []  # (heading or note, pid whose dump follows)
    asked: list[tuple[int, str, int]] = []  # pid, path, offset
    stopped: set[int] = set()
    for label, pid in workers:
        status, path = states.get(pid), files.get(pid)
        if status is None:
            continue
        if not path or path not in sizes:
            blocks.append((f"--- {label} [{status}]: no stack dump handler (a spawned script, a "
                           f"worker stopped before it got that far, or {STACKS_ENV} unset)", None))
            continue
        if not reach.signal(pid, signal.SIGUSR1):
            continue
        if status == "stopped" and reach.signal(pid, signal.SIGCONT):  # the pending SIGUSR1 is handled first
            stopped.add(pid)
        note = " [stopped: continued for the dump, then stopped again]" if pid in stopped else ""
        blocks.append((f"--- {label}{note}", pid))
        asked.append((pid, path, sizes[path]))
    if not blocks:
        return NO_WORKERS
    dumps = _collect(reach, asked, wait)
    for pid in stopped:
        reach.signal(pid, signal.SIGSTOP)  # as the test left it
    lines: list[str] = []
    for heading, dump_pid in blocks:
        lines.append(heading)
        if dump_pid is not None:
            lines.append(dumps.get(dump_pid, "").rstrip() or f"(no dump within {wait:g}s: in the kernel "
                                                             "(D state), or SIGUSR1 blocked)")
    return "\n".join(lines)


def _collect(reach: WorkerAccess, asked: list[tuple[int, str, int]], wait: float) -> dict[int, str]:
    """What each worker appended to its file: done once it grew and then held still."""
    deadline = time.monotonic() + wait
    last: dict[str, int] = {}
    done: set[int] = set()
    while len(done) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.05)
        sizes = reach.sizes([path for pid, path, _ in asked if pid not in done])
        for pid, path, offset in asked:
            if pid in done:
                continue
            size = sizes.get(path)
            if size is None or (size > offset and last.get(path) == size):
                done.add(pid)
            if size is not None:
                last[path] = size
    return {pid: reach.read(path, offset) for pid, path, offset in asked}
