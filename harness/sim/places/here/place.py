"""``Here``: this machine, the place every job runs its nodes in unless told otherwise.

A node is an agent process the warm pool's node server forks (``harness.sim.nodes.start``),
in its own network namespace with ``network="netns"``; its network faults are the job's
``Network`` (``harness.sim.net``), its cgroups this machine's (``MachineCgroups``), its
exit-code orders a file in the job's orders dir, which every worker reads. What this machine
lacks (namespaces, cgroups, FUSE) is probed, and chaos draws nothing that needs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from harness.endpoints import PortReservation
from harness.sim.nodes.faults import LocalOrders
from harness.sim.nodes.gpus import GpuPlan
from harness.sim.nodes.rendezvous_store import NETNS_STORE_PORT, STORE_ADDR, StoreSite
from harness.sim.nodes.scheduler import NoScheduler
from harness.sim.nodes.start import start_agent
from harness.sim.resources.cgroups import MachineCgroups
from harness.sim.storage.servers import MountServers

if TYPE_CHECKING:
    from harness.sim.config import ClusterConfig
    from harness.sim.faults import ScheduledFault
    from harness.sim.net import Network
    from harness.sim.nodes.pool import WarmPool
    from harness.sim.nodes.process import NodeProcess
    from harness.sim.nodes.start import StartingJob
    from harness.sim.storage.mount import StorageMount

__all__ = ["Here", "HereJob"]

R = TypeVar("R")


class Here:
    """This machine (``harness.sim.places.seam.Place``)."""

    name = "here"

    def __init__(self, config: ClusterConfig):
        self._config = config

    def check_entrypoint(self, entrypoint: object) -> None:
        """Anything ``Cluster.launch`` takes: a callable is pickled to an agent of this machine."""

    def prepare(self, pool: WarmPool, start_method: str) -> None:
        """The pool's zygote (its torch import overlaps the store's start) and node server
        (its runtime import too), started now."""
        if start_method == "zygote":
            pool.start()
        pool.node_server()

    def network_mode(self, network: str) -> str:
        """The cluster's own: the job's ``Network`` carries its nodes."""
        return network

    def planned_hosts(self) -> None:
        return None

    def gpu_split(self) -> GpuPlan:
        config = self._config
        return GpuPlan.resolve(config.gpus, config.max_nodes, config.nproc_per_node, {**os.environ, **config.env})

    def lacks(self, network: str) -> dict[str, str]:
        from harness.sim.net import netns_missing
        from harness.sim.resources import probe
        from harness.sim.schema import CGROUPS, FUSE, NETNS, SLURM_ADMIN, SLURMD
        from harness.sim.storage.mount import fuse_missing

        missing: dict[str, str] = {}
        if network != "netns":
            missing[NETNS] = (f"the job's nodes share one network (network={network!r}): a network "
                              "fault needs network='netns'")
        elif namespaces := netns_missing():
            missing[NETNS] = f"this machine lacks {'; '.join(namespaces)}"
        cgroups = probe()
        if isinstance(cgroups, str):
            missing[CGROUPS] = f"this machine lacks {cgroups}"
        fuse = fuse_missing()
        if fuse is not None:
            missing[FUSE] = f"this machine lacks {fuse}"
        missing[SLURM_ADMIN] = missing[SLURMD] = ("the job's nodes run on this machine, which no scheduler owns "
                                                  "(the scheduler's own faults need --elastic-slurm)")
        return missing

    def chaos_kinds(self, kinds: Sequence[str], max_nodes: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """Every kind: what this machine lacks is ``lacks``'s."""
        return tuple(kinds), {}

    def open(self, job: StartingJob) -> HereJob:
        return HereJob(job)

    def close(self) -> list[str]:
        """Nothing held for the cluster."""
        return []


class HereJob:
    """A job's nodes on this machine (``harness.sim.places.seam.JobPlace``)."""

    def __init__(self, job: StartingJob):
        self._job = job
        self.orders = LocalOrders(job.orders_dir)
        self.cgroups = MachineCgroups(lambda: job.run_id)
        self.scheduler = NoScheduler("runs on this machine, which no scheduler owns: the scheduler's own faults need "
                                     "the nodes in a Slurm allocation (--elastic-slurm)")

    @property
    def network(self) -> Network:
        """The job's ``Network`` (built with its first node)."""
        return self._job.net  # type: ignore[return-value]

    def disk_servers(self, mount: StorageMount, answer: Callable[[str, dict[str, Any]], Any]) -> MountServers:
        """The job's one mount serves every node's disk and the shared filesystem."""
        return MountServers(mount)

    def start(self, index: int, rdzv: Mapping[str, Any]) -> NodeProcess:
        return start_agent(self._job, index, dict(rdzv))

    def address(self, node: int) -> str:
        return self._job.net.address(node)

    def store_site(self) -> StoreSite:
        """The job's network's store host: its namespace and fixed port with namespaces,
        else this machine's loopback and a port the server picks."""
        net = self._job.net
        return StoreSite(net.store_address, NETNS_STORE_PORT if net.mode == "netns" else 0, net.enter_store())

    def store_port(self, node: int) -> tuple[PortReservation | None, str]:
        """In namespaces the node's own address and the store's fixed port (nothing else
        listens in its namespace); on loopback a port held until the agent binds it."""
        net = self._job.net
        if net.mode == "netns":
            return None, f"{net.address(node)}:{NETNS_STORE_PORT}"
        reservation = PortReservation()
        return reservation, f"{STORE_ADDR}:{reservation.port}"

    def refuse(self, entries: Sequence[ScheduledFault]) -> None:
        """Nothing: what this machine lacks, the part that needs it says when it fires."""

    def guarded(self, kind: str, act: Callable[..., R]) -> Callable[..., R]:
        return act

    def close(self) -> list[str]:
        """Nothing of its own: the job's network, cgroups and disks are closed by their parts."""
        return []
