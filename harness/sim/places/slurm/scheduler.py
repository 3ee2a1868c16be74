"""``SlurmScheduler``: the scheduler faults of a job's nodes (``harness.sim.nodes.scheduler``)
carried out by the Slurm allocation they run in.

A job's node is known to the faults by its index; to Slurm by the name of the node of the
allocation its step runs on (``host_of``: chosen once, when the node starts). Why a module of
its own: the part asks the place "which scheduler owns node i", and this is the whole
answer on Slurm: a name and the allocation's own calls.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.errors import ConfigError
from harness.hosts import HostError, HostSpec, SlurmAllocation

__all__ = ["SlurmScheduler"]


class SlurmScheduler:
    """The allocation's Slurm as the scheduler of the job's nodes (``NodeScheduler``)."""

    def __init__(self, allocation: SlurmAllocation, host_of: Callable[[int], HostSpec]):
        self.allocation = allocation
        self._host_of = host_of

    def node_name(self, node: int) -> str:
        host = self._host_of(node)
        if host.name is None:  # an allocation's hosts are named by Slurm: a defect if not
            raise ConfigError("node", node, f"runs on {host.label}, which Slurm does not name")
        return host.name

    def set_state(self, node: int, state: str, reason: str) -> None:
        self._act(lambda: self.allocation.set_state(self.node_name(node), state, reason))

    def kill_daemon(self, node: int) -> None:
        self._act(lambda: self.allocation.kill_slurmd(self.node_name(node)))

    def start_daemon(self, node: int) -> None:
        self._act(lambda: self.allocation.start_slurmd(self.node_name(node)))

    @staticmethod
    def _act(act: Callable[[], None]) -> None:
        """``act``, a Slurm client's failure said as a fault's (``FaultError``: one line)."""
        from harness.sim.errors import FaultError

        try:
            act()
        except HostError as e:
            raise FaultError(str(e)) from None
