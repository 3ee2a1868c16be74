"""Where a thread's time went: running, or runnable and waiting for a CPU (the kernel's
``/proc/thread-self/schedstat``); the rest of its wall time it slept.

Two readers need the split. A training worker's step reports it, so a straggler can be
named by the CPU it waited for (``harness.sim.truth.progress``). And a node that fences
itself because its keep-alive went unanswered for its lease says where that silence went
(``harness.rendezvous._keeper``): a keeper thread that waited for a CPU was starved by an
overloaded host; one that slept was waiting for the store's answer (or the GIL, or it was
stopped). A red run's log must tell those apart: the first is the machine, the second the
store or the network.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

__all__ = ["ThreadCpu", "CpuSpan", "cpu_span"]

class ThreadCpu:
    """The CPU times of one thread of this process: ``ThreadCpu(tid)`` follows thread
    ``tid`` (any thread may ask); ``ThreadCpu()`` follows whichever thread calls
    ``times()`` (reopened for another thread, or in a forked child). The schedstat file is
    opened once and read with ``pread``: a few microseconds, thread-safe."""

    def __init__(self, tid: int | None = None) -> None:
        self._tid = tid
        self._fd: int | None = None
        self._owner: tuple[int, int] | None = None  # (pid, thread id) the fd names

    def times(self) -> tuple[float, float] | None:
        """(seconds run, seconds runnable but waiting for a CPU) of the thread; None where
        /proc has no schedstat (or the thread is gone)."""
        owner = (os.getpid(), self._tid if self._tid is not None else threading.get_native_id())
        try:
            if self._fd is None or self._owner != owner:
                if self._fd is not None and self._owner is not None and self._owner[0] == owner[0]:
                    os.close(self._fd)  # not after a fork: the child's copy is its own to drop
                self._fd = None
                self._fd = os.open(f"/proc/self/task/{owner[1]}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
                self._owner = owner
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[0]) / 1e9, int(fields[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None and self._owner is not None and self._owner[0] == os.getpid():
            os.close(self._fd)
        self._fd = None


@dataclass(frozen=True)
class CpuSpan:
    """A stretch of one thread's wall time, split: ``ran`` + ``waited`` (for a CPU) +
    ``slept`` = ``wall``."""

    wall: float
    ran: float
    waited: float

    @property
    def slept(self) -> float:
        return max(0.0, self.wall - self.ran - self.waited)

    def describe(self, who: str) -> str:
        """``who`` waited 0.91s for a CPU, ran 0.02s and slept 0.37s (...)."""
        return (f"{who} waited {self.waited:.2f}s for a CPU, ran {self.ran:.2f}s and slept "
                f"{self.slept:.2f}s (for an answer, the GIL, or stopped)")


def cpu_span(start: tuple[float, float, float] | None, end: tuple[float, float, float] | None) -> CpuSpan | None:
    """The span between two ``(monotonic, ran, waited)`` marks of one thread (None if a
    mark is missing)."""
    if start is None or end is None:
        return None
    return CpuSpan(wall=end[0] - start[0], ran=end[1] - start[1], waited=end[2] - start[2])
