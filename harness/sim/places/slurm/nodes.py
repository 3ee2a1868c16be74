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
says why. The scheduler's own faults (``down_node``, ``drain_node``, ``kill_slurmd``) are
the allocation's to do (``SlurmScheduler``), refused on any other place.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.hosts import HostError, HostSpec, SlurmAllocation
from harness.sim.places.hosts.nodes import RemoteNodeProcess, RemoteNodes
from harness.sim.places.slurm.scheduler import SlurmScheduler

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
        self.scheduler = SlurmScheduler(allocation, self.host_of)
        self._placed: dict[int, HostSpec] = {}  # node -> its Slurm node, chosen at its first ask
        self._placing = threading.Lock()  # not the hosts' lock: that one is held around host_of

    def host_of(self, node: int) -> HostSpec:
        """Node ``node``'s Slurm node, chosen once: the job's first nodes round robin as on
        hosts; a node added later on the first node of the allocation that carries none of
        the job's live nodes, as a new step on a real allocation would, else round robin,
        in either case never on one a fault took out of service (DOWN, drained, its slurmd
        killed) while another is in service."""
        with self._placing:
            chosen = self._placed.get(node)
            if chosen is None:
                if node < len(self.hosts):
                    chosen = super().host_of(node)
                else:
                    busy = {self._placed.get(n) for n, handle in self._job.nodes.items() if handle.alive()}
                    lost = self.allocation.out_of_service()
                    usable = [host for host in self.hosts if host.label not in lost] or list(self.hosts)
                    idle = [host for host in usable if host not in busy]
                    chosen = idle[0] if idle else usable[node % len(usable)]
                self._placed[node] = chosen
            return chosen

    def start(self, index: int, rdzv: Any) -> SlurmNodeProcess:
        node = super().start(index, rdzv)
        assert isinstance(node, SlurmNodeProcess)
        node.allocation = self.allocation
        return node
