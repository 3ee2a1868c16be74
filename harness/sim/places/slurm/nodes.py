"""A node of a Slurm job step, as the job holds it: the hosts' node, signalled by Slurm where
Slurm has a way.

``kill_node`` is the step killed by Slurm (``scancel --signal=KILL JOB.STEP``: every process
of the step, the agent's supervisor, the agent and its workers), as the scheduler kills a
real job's step; the step is the one the node's agent said it runs as (its ``slurm_step``
event). ``remove_node`` keeps its meaning, SIGTERM to the agent alone, by the agent's
supervisor on the node: Slurm's ``scancel --signal=TERM`` reaches every process of the step,
the workers too, before the agent can tell the others it leaves, so a graceful leave became
a failure of the others' collectives (measured: the bundled ``scale_down_leave`` and
``flapping_node``, ``max_restarts = 0``, went red so). Freezing and a worker's faults go
through the supervisor too, as on an SSH host: Slurm's ``SIGSTOP`` would stop the supervisor
as well. Where the step is not known yet (a fault in the moment before the agent's first
event came in), or scancel could not run, the supervisor kills the node instead, and the log
says why. ``down_node``, the scheduler's own
node failure, is Slurm's alone: the node's Slurm node marked DOWN (``SlurmAllocation.down``),
refused on any other place.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.hosts import HostError, HostSpec, SlurmAllocation
from harness.sim.places.hosts.nodes import RemoteNodeProcess, RemoteNodes
from harness.sim.places.hosts.refusals import refuse_faults

if TYPE_CHECKING:
    from harness.sim.faults import ScheduledFault

__all__ = ["SlurmNodeProcess", "SlurmNodes"]

_log = logging.getLogger(__name__)

#: the signals Slurm delivers to a node's whole step (its faults' way on Slurm)
BY_SLURM = {int(signal.SIGKILL)}


@dataclass
class SlurmNodeProcess(RemoteNodeProcess):
    """A node whose agent is a job step of ``allocation`` (``placed`` names its job; its
    agent names its step)."""

    allocation: SlurmAllocation | None = None

    def step(self) -> str | None:
        """``JOB.STEP`` of the node's agent (None: its ``slurm_step`` event is not in yet)."""
        said = self.timeline.events("slurm_step", self.index) if self.timeline is not None else []
        return str(said[-1]["step"]) if said else None

    def placed(self) -> dict[str, str]:
        return {**super().placed(), **({"slurm_job": self.allocation.job_id} if self.allocation else {})}

    def scheduler_node(self) -> str | None:
        return self.host if self.allocation is not None else None

    def scheduler_down(self) -> None:
        assert self.allocation is not None
        self.allocation.down(self.host, f"pytest-elastic down_node of node {self.index}")

    def signal_node(self, sig: int, worker_pids: Iterable[int] = ()) -> None:
        if not self._by_slurm(sig):
            super().signal_node(sig, worker_pids)

    def _by_slurm(self, sig: int) -> bool:
        """``sig`` to the node's step by Slurm; False where the supervisor must do it."""
        if int(sig) not in BY_SLURM or self.allocation is None:
            return False
        step = self.step()
        if step is None:
            _log.warning("node %d: its Slurm step is not known yet (no slurm_step event): %s by its supervisor",
                         self.index, signal.Signals(sig).name)
            return False
        try:
            self.allocation.signal_step(step, sig)
        except HostError as e:
            _log.warning("node %d: %s; %s by its supervisor instead", self.index, e, signal.Signals(sig).name)
            return False
        return True


class SlurmNodes(RemoteNodes):
    """The hosts' nodes, each a ``SlurmNodeProcess`` of ``allocation``."""

    node_type = SlurmNodeProcess

    def __init__(self, *args: Any, allocation: SlurmAllocation, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.allocation = allocation
        self._placed: dict[int, HostSpec] = {}  # node -> its Slurm node, chosen at its first ask
        self._placing = threading.Lock()  # not the hosts' lock: that one is held around host_of

    def host_of(self, node: int) -> HostSpec:
        """Node ``node``'s Slurm node, chosen once: the first node of the allocation that
        carries none of the job's live nodes and that no ``down_node`` took from it (a node
        added after one was lost lands on an idle node, as a new step on a real
        allocation would), else round robin as on hosts."""
        with self._placing:
            chosen = self._placed.get(node)
            if chosen is None:
                busy = {self._placed.get(n) for n, handle in self._job.nodes.items() if handle.alive()}
                lost = set(self.allocation.downed)
                idle = [host for host in self.hosts if host not in busy and host.label not in lost]
                chosen = idle[0] if idle and node >= len(self.hosts) else super().host_of(node)
                self._placed[node] = chosen
            return chosen

    def refuse(self, entries: Sequence[ScheduledFault]) -> None:
        """As on hosts, but the scheduler's own faults (``slurm_only``) are Slurm's to do here."""
        refuse_faults(entries, self.hosts, self.placement, self.node_count(), slurm=True)

    def start(self, index: int, rdzv: Any) -> SlurmNodeProcess:
        node = super().start(index, rdzv)
        assert isinstance(node, SlurmNodeProcess)
        node.allocation = self.allocation
        return node
