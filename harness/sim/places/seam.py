"""The seam between a job and the place its nodes run in: ``Place`` and ``JobPlace``.

A cluster has one ``Place`` (``harness.sim.places.place_of`` picks it from its settings):
what every job of the cluster runs its nodes on. It answers what a cluster asks before a
job starts (which entrypoints it can run, whether the warm pool is of use, which network
mode the job's own ``Network`` takes, how GPUs are split, which chaos kinds it can carry
out and what it lacks), and opens one ``JobPlace`` per job.

A ``JobPlace`` is the job's nodes in that place: it starts a node's agent and says its
address; it is where exit-code orders are left (``orders``), where the network faults are
carried out (``network``), where the nodes' cgroups are (``cgroups``), which scheduler owns
them (``scheduler``), where a node-hosted store keeps its port (``store_port``); it
refuses, in one line, the faults it cannot carry out (``refuse``, ``guarded``) and ends
everything it started (``close``).

The job always holds one (``job.place``): no ``None`` meaning "this machine". The fault
parts are handed what they need of it when the job builds them, and never ask where the
nodes are. A new place is a room of its own under ``harness.sim.places`` implementing both
protocols (docs/architecture.md, "Adding a place").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from harness.hosts import HostSpec
    from harness.sim.faults import ScheduledFault
    from harness.sim.net.faults import NodeNetwork
    from harness.sim.nodes.faults import OrdersPlace
    from harness.sim.nodes.pool import WarmPool
    from harness.sim.nodes.process import NodeProcess
    from harness.sim.nodes.rendezvous_store import StoreSite
    from harness.sim.nodes.scheduler import NodeScheduler
    from harness.sim.resources.faults import NodeCgroups
    from harness.sim.storage.mount import StorageMount
    from harness.sim.storage.servers import DiskServers

__all__ = ["GpuSplit", "JobPlace", "Place"]

R = TypeVar("R")


class GpuSplit(Protocol):
    """How the GPUs of a place are split between node slots (``harness.sim.nodes.gpus.GpuPlan``
    on this machine, ``HostsGpuPlan`` over hosts)."""

    @property
    def backend(self) -> str:
        """``nccl`` when every worker of the job has a GPU of its own, else ``gloo``."""
        ...

    def slot(self, index: int) -> tuple[str, ...]:
        """The ``CUDA_VISIBLE_DEVICES`` ids of node slot ``index``."""
        ...


class JobPlace(Protocol):
    """One job's nodes in their place (``job.place``)."""

    @property
    def orders(self) -> OrdersPlace:
        """Where the job's exit-code orders are left for its workers."""
        ...

    @property
    def network(self) -> NodeNetwork:
        """Where the job's network faults are carried out (read when a fault is: a place
        may build its network with the job's first node)."""
        ...

    @property
    def cgroups(self) -> NodeCgroups:
        """Where the job's nodes' cgroups are (made on first use)."""
        ...

    @property
    def scheduler(self) -> NodeScheduler:
        """The scheduler that owns the job's nodes, as its own faults reach it (``NoScheduler``
        where none does: it refuses them, saying why)."""
        ...

    def disk_servers(self, mount: StorageMount, answer: Callable[[str, dict[str, Any]], Any]) -> DiskServers:
        """Who serves the job's disks and shared filesystem (the storage part asks, with the
        job's own ``mount`` and its ``answer`` to a server's requests: a watched file seen)."""
        ...

    def start(self, index: int, rdzv: Mapping[str, Any]) -> NodeProcess:
        """Start node ``index``'s agent, rendezvousing with ``rdzv``; its handle (not yet
        in ``job.nodes``)."""
        ...

    def address(self, node: int) -> str:
        """Node ``node``'s IP address, as its peers reach it."""
        ...

    def store_site(self) -> StoreSite:
        """Where the harness's own store for the job listens (its address, port, namespace)."""
        ...

    def store_port(self, node: int) -> tuple[Any, str]:
        """For a store node ``node``'s agent hosts: (what keeps its port until the agent
        binds it, or None; the endpoint every agent reaches the store at)."""
        ...

    def refuse(self, entries: Sequence[ScheduledFault]) -> None:
        """``FaultRefused`` (one line: the node, what its place lacks) for the first of
        ``entries`` this place cannot carry out; nothing where it can do them all."""
        ...

    def guarded(self, kind: str, act: Callable[..., R]) -> Callable[..., R]:
        """``act`` (the part's method of fault ``kind``, as ``job.<kind>`` calls it), refused
        first as a scheduled fault of the same fields would be."""
        ...

    def close(self) -> list[str]:
        """End everything the place started for the job (after its nodes were killed);
        what could not be ended, one line each."""
        ...


class Place(Protocol):
    """Where every job of a cluster runs its nodes."""

    #: its name, as reports and the timeline say it ("here", "hosts")
    name: str

    def check_entrypoint(self, entrypoint: object) -> None:
        """``ConfigError`` for an entrypoint this place cannot run (a callable it would
        have to pickle across a network)."""
        ...

    def prepare(self, pool: WarmPool, start_method: str) -> None:
        """Get ready to start a job's nodes (this machine: warm the pool's servers)."""
        ...

    def network_mode(self, network: str) -> str:
        """The mode of the job's own ``Network`` (the harness's store lives in it) for a
        cluster of ``network`` (hosts: loopback, their own network carries the nodes)."""
        ...

    def gpu_split(self) -> GpuSplit:
        """How this place's GPUs are split between node slots."""
        ...

    def planned_hosts(self) -> tuple[HostSpec, ...] | None:
        """The hosts its nodes run on as far as is known before a job runs (what a job's
        faults and chaos kinds are judged by, the plugin's skips among them): a Slurm
        allocation's nodes as its spec says they will be until it is made; None: this
        machine. Never makes anything (no connection, no allocation)."""
        ...

    def lacks(self, network: str) -> dict[str, str]:
        """Capability (``harness.sim.schema.NETNS``, ``CGROUPS``, ``FUSE``) -> why this place
        cannot use it for a cluster of ``network``: what chaos must not draw."""
        ...

    def chaos_kinds(self, kinds: Sequence[str], max_nodes: int) -> tuple[tuple[str, ...], dict[str, str]]:
        """(the kinds of ``kinds`` a job of at most ``max_nodes`` nodes can be dealt here,
        kind -> why not for the others)."""
        ...

    def open(self, job: Any) -> JobPlace:
        """The job's nodes in this place (``job.place``)."""
        ...

    def close(self) -> list[str]:
        """End what the place holds for the cluster (a Slurm allocation of its own), once
        every job ended; what could not be ended, one line each."""
        ...
