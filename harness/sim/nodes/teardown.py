"""The killing half of a job's end (``Job.terminate``): every process the job started, and
the FIFOs an agent that ended on its own must have removed (``Cluster.close`` checks).

Every worker ever started is SIGKILLed with its process group, but only while its pid still
names the process that started (``is_same_process``: never a reused pid); every agent still
alive is resumed (a frozen node ignores nothing else) and SIGKILLed, then reaped, and its
exit recorded on the node's timeline by the ledger. What survives five seconds is reported,
not ignored (``survivors``, asked once the job's filesystem is gone: a process stuck in it
may only end then), and ``Cluster.close`` raises ``ClusterLeakError`` with it.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

    from harness.sim.nodes.ledger import NodeLedger
    from harness.sim.nodes.process import NodeProcess
    from harness.sim.truth.timeline import Timeline

__all__ = ["fifos_under", "kill_all", "survivors"]

#: seconds the killed workers get to be reaped before they are reported as survivors
REAP_S = 5.0


def kill_all(nodes: Mapping[int, NodeProcess], timeline: Timeline,
             ledger: NodeLedger) -> tuple[set[int], list[psutil.Process]]:
    """SIGKILL every worker and live agent of ``nodes``; (the nodes whose agents had to be
    killed, the workers still alive after ``REAP_S``)."""
    import psutil

    killed: set[int] = set()
    victims: list[psutil.Process] = []
    for index, node in nodes.items():
        for pid in node.kill_workers(timeline.events("worker_start", index)):
            _add_process(victims, pid)
        if node.alive():
            killed.add(index)
            ledger.harm(index, "close")
            node.signal_node(signal.SIGCONT)  # a frozen agent ignores everything else
            node.signal_node(signal.SIGKILL)
        node.popen.wait()
        ledger.record_exit(index)
    _, alive = psutil.wait_procs(victims, timeout=REAP_S)
    return killed, alive


def survivors(alive: list[psutil.Process]) -> list[str]:
    """``kill_all``'s survivors that are still more than a zombie, one line each."""
    import psutil

    return [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def fifos_under(directory: str) -> list[str]:
    """Every FIFO below ``directory`` (timer FIFOs an agent left behind)."""
    found = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                continue
    return found


def _add_process(into: list[psutil.Process], pid: int) -> None:
    import psutil

    try:
        into.append(psutil.Process(pid))
    except psutil.NoSuchProcess:
        pass
