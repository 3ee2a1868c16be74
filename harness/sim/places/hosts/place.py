"""``Hosts``: the place of a cluster whose nodes run on hosts over SSH (``Cluster(hosts=...)``).

Its jobs' nodes are ``RemoteNodes`` (``harness.sim.places.hosts.nodes``): each node's agent started
on its host (placed round robin, or by ``placement``) under the host's supervisor, its events
relayed here. A host's network, cgroups and disk are its own, where its capabilities (the
hosts file's) allow them; what a host cannot do is refused when it is scheduled, and left out
of chaos, in one line naming the host and what it lacks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.sim.places.hosts.gpus import HostsGpuPlan
from harness.sim.places.hosts.nodes import RemoteNodes
from harness.sim.places.hosts.refusals import chaos_kinds

if TYPE_CHECKING:
    from harness.hosts import HostSpec
    from harness.sim.config import ClusterConfig
    from harness.sim.nodes.pool import WarmPool
    from harness.sim.places.hosts.nodes import PlacedJob

__all__ = ["Hosts"]


class Hosts:
    """The hosts of a cluster (``harness.sim.places.seam.Place``)."""

    name = "hosts"

    def __init__(self, config: ClusterConfig):
        self._config = config
        self._hosts: tuple[HostSpec, ...] = tuple(config.hosts or ())
        self.placement = tuple(config.placement) if config.placement is not None else None

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        """The hosts the nodes are placed on (``placement``, else round robin)."""
        return self._hosts

    def check_entrypoint(self, entrypoint: object) -> None:
        """A script path or a module only: a node on a host gets its entrypoint as JSON."""
        if not isinstance(entrypoint, str):
            raise ConfigError("entrypoint", entrypoint, "must be a script path or a module (module=True) with "
                              "hosts: a node on a host gets its entrypoint as JSON, never a pickled callable")

    def prepare(self, pool: WarmPool, start_method: str) -> None:
        """Nothing: a node on a host forks its workers there (the agent's own zygote)."""

    def network_mode(self, network: str) -> str:
        """Loopback: the job's own network holds the harness's store alone; the hosts' own
        carries the nodes."""
        return "loopback"

    def gpu_split(self) -> HostsGpuPlan:
        return self._gpus

    @functools.cached_property
    def _gpus(self) -> HostsGpuPlan:
        """Each host's GPUs split between the node slots placed on it (one plan for the
        cluster: a node started later takes a slot no live node of its host holds)."""
        return HostsGpuPlan(self.hosts, self.placement, self._config.max_nodes, self._config.nproc_per_node)

    def planned_hosts(self) -> tuple[HostSpec, ...]:
        return tuple(self.hosts)

    def lacks(self, network: str) -> dict[str, str]:
        """Nothing cluster-wide: each host's capabilities are judged per kind (``chaos_kinds``)."""
        return {}

    def chaos_kinds(self, kinds: Sequence[str], max_nodes: int) -> tuple[tuple[str, ...], dict[str, str]]:
        return chaos_kinds(kinds, self.hosts, self.placement, max_nodes)

    def open(self, job: PlacedJob) -> RemoteNodes:
        return RemoteNodes(job, self._gpus, self.hosts, self.placement)

    def close(self) -> list[str]:
        """Nothing held for the cluster: each job's connections are its own."""
        return []
