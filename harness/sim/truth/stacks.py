"""The Python stacks of a job's live workers, on demand: what a hang is named with.

Workers install ``faulthandler`` for ``SIGUSR1`` when ``HARNESS_STACK_DUMP_DIR`` is in their
environment (``harness.procs.STACKS_ENV``: the zygote's forked child and a callable's child
do it; a spawned script runs nothing of ours first, so it has no handler). Here we signal
each live worker that has its dump file, wait until what it appended holds still, and
collect it. A stopped worker (``hang_worker``, ``freeze_node``) is continued for the dump
and stopped again, so the job stays as it was. Workers without the handler are listed with
their state only, never signalled: SIGUSR1's default action would kill them.

Used by ``Job.wait`` when it names a hang (``harness.sim.truth.hangs``) and by the pytest plugin
when a test times out (``pytest_elastic._timeout``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from harness.procs import STACKS_ENV

if TYPE_CHECKING:
    from harness.sim.truth.subject import StackedJob

__all__ = ["DUMP_WAIT_S", "job_workers", "worker_stacks"]

DUMP_WAIT_S = 3.0


def job_workers(job: StackedJob, label: str = "", nodes: Iterable[int] | None = None) -> Iterator[tuple[str, int]]:
    """(label, pid) of every live worker of ``job`` (of ``nodes`` only, when given)."""
    for index in sorted(job.nodes if nodes is None else nodes):
        if job.nodes[index].remote:  # its workers are the host's processes: not signalled from here
            continue
        name = job.node_name(index)
        ranks = {e["local_rank"]: e.get("rank") for e in job.timeline.events("worker_start", index)}
        for local_rank, pid in sorted(job.worker_pids(index).items()):
            yield (f"{label}node {index} ({name}) local_rank {local_rank} rank {ranks.get(local_rank)} "
                   f"pid {pid}", pid)


def worker_stacks(workers: Iterable[tuple[str, int]], stacks_dir: str | None,
                  wait: float = DUMP_WAIT_S) -> str:
    """Ask each (label, pid) worker for its Python stacks; the collected text, worker by
    worker (a note in place of a stack where there is none to be had)."""
    import psutil

    blocks: list[tuple[str, int | None]] = []  # (heading or note, pid whose dump follows)
    asked: list[tuple[int, str, int]] = []  # pid, path, offset
    stopped: set[int] = set()
    for label, pid in workers:
        try:
            status = psutil.Process(pid).status()
        except psutil.Error:
            continue
        path = os.path.join(stacks_dir, f"{pid}.txt") if stacks_dir else ""
        if not path or not os.path.exists(path):
            blocks.append((f"--- {label} [{status}]: no stack dump handler (a spawned script, a "
                           f"worker stopped before it got that far, or {STACKS_ENV} unset)", None))
            continue
        offset = os.path.getsize(path)
        try:
            os.kill(pid, signal.SIGUSR1)
            if status == psutil.STATUS_STOPPED:
                os.kill(pid, signal.SIGCONT)  # the pending SIGUSR1 is handled first
                stopped.add(pid)
        except ProcessLookupError:
            continue
        note = " [stopped: continued for the dump, then stopped again]" if pid in stopped else ""
        blocks.append((f"--- {label}{note}", pid))
        asked.append((pid, path, offset))
    if not blocks:
        return "(no live workers)"
    dumps = _collect(asked, wait)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGSTOP)  # as the test left it
        except ProcessLookupError:
            pass
    lines: list[str] = []
    for heading, dump_pid in blocks:
        lines.append(heading)
        if dump_pid is not None:
            lines.append(dumps.get(dump_pid, "").rstrip() or f"(no dump within {wait:g}s: in the kernel "
                                                             "(D state), or SIGUSR1 blocked)")
    return "\n".join(lines)


def _collect(asked: list[tuple[int, str, int]], wait: float) -> dict[int, str]:
    """What each worker appended to its file: done once it grew and then held still."""
    deadline = time.monotonic() + wait
    sizes: dict[int, int] = {}
    done: set[int] = set()
    while len(done) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid, path, offset in asked:
            if pid in done:
                continue
            try:
                size = os.path.getsize(path)
            except OSError:
                done.add(pid)
                continue
            if size > offset and sizes.get(pid) == size:
                done.add(pid)
            sizes[pid] = size
    out = {}
    for pid, path, offset in asked:
        try:
            with open(path, errors="replace") as fp:
                fp.seek(offset)
                out[pid] = fp.read()
        except OSError:
            out[pid] = ""
    return out
