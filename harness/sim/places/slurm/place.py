"""``Slurm``: the place of a cluster whose nodes run in a Slurm allocation (``Cluster(slurm=...)``).

The allocation is made when the cluster's first job opens its place (``salloc --no-shell``,
as many nodes as the job's most, or the spec's ``nodes``), or is the caller's (``job_id``,
``$SLURM_JOB_ID``), and is shared by every job of the cluster (a twin is a cluster of its
own: an allocation of its own); ours is released when the cluster closes (``scancel``:
whatever still runs in it ends with it).

A job's nodes are the hosts' place's ``RemoteNodes`` (``SlurmNodes``, ``nodes``: a node
killed is its step killed by Slurm): each node of the allocation is a host whose channel is
job steps (``SrunHost``: the agent, its events relay, every order to it is a step on its
node), the job's first nodes placed round robin, a node added later on an idle one. Slurm
forwards no port: the harness's store listens
at the spec's ``controller_address`` (in its ``controller_netns`` where one is named), and
every node reaches it there, the job's secret proving it belongs. What a node cannot carry
out is refused as on hosts, by its capabilities (the spec's).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.hosts import HostSpec, SlurmAllocation
from harness.procs import join_netns
from harness.sim.nodes.rendezvous_store import StoreSite
from harness.sim.places.hosts.nodes import PlacedJob, RemoteNodes
from harness.sim.places.hosts.place import Hosts
from harness.sim.places.slurm.nodes import SlurmNodes

if TYPE_CHECKING:
    from harness.hosts import SlurmSpec
    from harness.sim.config import ClusterConfig

__all__ = ["Slurm"]


class Slurm(Hosts):
    """A cluster's Slurm allocation (``harness.sim.places.seam.Place``): the hosts' place,
    its hosts the allocation's nodes (made on first use), its nodes' channel job steps."""

    name = "slurm"

    def __init__(self, config: ClusterConfig):
        self._config = config
        self.spec: SlurmSpec = config.slurm
        self._allocation: SlurmAllocation | None = None
        self._hosts = ()
        self.placement = None  # round robin over the allocation's nodes
        self._lock = threading.Lock()

    def allocation(self) -> SlurmAllocation:
        """The allocation (made on first use) and, with it, its nodes as hosts."""
        with self._lock:
            if self._allocation is None:
                allocation = SlurmAllocation(self.spec, self._config.max_nodes)
                try:
                    self._hosts = tuple(allocation.host_spec(name, address) for name, address in allocation.nodes())
                except BaseException:
                    allocation.close()
                    raise
                self._allocation = allocation
            return self._allocation

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        self.allocation()
        return self._hosts

    def planned_hosts(self) -> tuple[HostSpec, ...]:
        """The allocation's nodes once it is made; before, the spec's stand-ins."""
        from harness.hosts import stand_ins

        with self._lock:
            return self._hosts if self._allocation is not None else stand_ins(self.spec, self._config.max_nodes)

    def check_entrypoint(self, entrypoint: object) -> None:
        """A script path or a module only: a node's agent gets its entrypoint as JSON."""
        if not isinstance(entrypoint, str):
            raise ConfigError("entrypoint", entrypoint, "must be a script path or a module (module=True) on "
                              "Slurm: a node's agent gets its entrypoint as JSON, never a pickled callable")

    def store_site(self) -> StoreSite:
        """Where the harness's store listens: the controller's address the nodes reach."""
        netns = self.spec.controller_netns
        return StoreSite(self.spec.controller_address, 0,
                         functools.partial(join_netns, netns) if netns is not None else None)

    def open(self, job: PlacedJob) -> RemoteNodes:
        allocation = self.allocation()
        return SlurmNodes(job, self._gpus, self.hosts, None, connect=allocation.connect, store=self.store_site(),
                          allocation=allocation)

    def close(self) -> list[str]:
        """Release the allocation if it is ours; what went wrong, one line each."""
        with self._lock:
            allocation, self._allocation = self._allocation, None
        return allocation.close() if allocation is not None else []
