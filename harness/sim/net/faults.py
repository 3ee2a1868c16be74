"""A job's network faults (``job.network``): cut, thin and heal the links of nodes.

Each node of a ``Cluster(network="netns")`` is a network host (``harness.sim.net``). These
methods apply a fault to the job's ``Network`` (``job.net``) and record it on the timeline
as a ``fault`` event (its start); ``Job.heal`` ends them (``end_lasting``) and records a
``heal`` event naming what ended, so reports draw a fault that lasts as a span and the
invariant checker can tell whether every partition the test made was healed. In loopback
mode every one of them raises a ``ConfigError`` that names what is missing (network
namespaces, root). The job's place says who carries them out: this machine's ``Network``,
or with the nodes on hosts (``Cluster(hosts=...)``) each node's host
(``harness.sim.places.hosts.network.HostNetwork``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from harness.sim.faults.target import Ended, record_fault

if TYPE_CHECKING:
    from harness.sim.faults.target import FaultTarget
    from harness.sim.net.network import NetworkChange

__all__ = ["NetworkFaults", "NodeNetwork"]


class NodeNetwork(Protocol):
    """The nodes' network as their faults see it: ``Network`` (this machine's namespaces)
    or ``harness.sim.places.hosts.network.HostNetwork`` (the hosts')."""

    def address(self, node: int) -> str: ...

    def partition(self, node: int, peers: str | Sequence[int] = "all", direction: str = "both") -> NetworkChange: ...

    def packet_loss(self, node: int, probability: float) -> NetworkChange: ...

    def bandwidth(self, node: int, rate: str | int) -> NetworkChange: ...

    def link_down(self, node: int) -> NetworkChange: ...

    def host_unreachable(self, node: int, seconds: float = 3.0,
                         on_back: Callable[[dict[str, Any]], None] | None = None) -> NetworkChange: ...

    def heal(self, node: int | None = None) -> NetworkChange: ...

    def faulted(self) -> dict[int, list[str]]: ...


class NetworkFaults:
    """The network faults of one job (``job.network``); they last until ``Job.heal``."""

    def __init__(self, target: FaultTarget, network: Callable[[], NodeNetwork]):
        self._target = target
        #: the nodes' network as their place has it now (this machine's: the job's ``Network``,
        #: built with its first node; on hosts, theirs)
        self._net = network

    def address(self, node: int) -> str:
        """Node ``node``'s IP address: inside 198.18.0.0/15 with ``network="netns"`` (in
        namespaces the harness made), a 127.0.1.x address in loopback mode."""
        self._target.node(node)
        return self._net().address(node)

    def partition(self, node: int, peers: str | Sequence[int] = "all", direction: str = "both") -> None:
        """Silently drop node ``node``'s packets to and from ``peers`` ("all", "store" --
        the rendezvous store -- or a list of nodes); ``direction`` "in" or "out" cuts one
        way only. No RST, no FIN: the others learn nothing until their timeouts say so."""
        self._target.node(node)
        peers = peers if isinstance(peers, str) else list(peers)  # a spec's tuple, a TOML array
        self._record(self._net().partition(node, peers=self._store_peers(peers), direction=direction))

    def packet_loss(self, node: int, probability: float) -> None:
        """Drop each of node ``node``'s packets with ``probability`` (0..1), both ways."""
        self._target.node(node)
        self._record(self._net().packet_loss(node, probability))

    def bandwidth(self, node: int, rate: str | int) -> None:
        """Limit node ``node``'s link to ``rate`` (e.g. "1mbit", or bits per second)."""
        self._target.node(node)
        self._record(self._net().bandwidth(node, rate))

    def host_unreachable(self, node: int, seconds: float = 3.0) -> None:
        """This machine loses node ``node``'s host for ``seconds`` (nodes on hosts only: the
        host drops the harness's SSH connections, and lifts that itself). Recorded when the
        cut is felt; a ``host_reachable`` event says what came of it once the host answers
        again (``connection``: "kept", "reconnected" -- the node was lost with the old one --
        or "lost"; ``unreachable_s``)."""
        self._target.node(node)
        self._record(self._net().host_unreachable(node, seconds, on_back=lambda fields: self._target.record(
            "host_reachable", target_node=node, **fields)))

    def link_down(self, node: int) -> None:
        """Unplug node ``node``'s cable: its interface loses carrier (until healed)."""
        self._target.node(node)
        self._record(self._net().link_down(node))

    # -- lasting faults (``LastingFaults``) ------------------------------------------------

    def end_lasting(self, node: int | None) -> Ended:
        """End node ``node``'s network faults (partitions, loss, bandwidth, link down), or
        every node's with None; what ended. Loopback mode: ``ConfigError`` (nothing to heal)."""
        return Ended(list(self._net().heal(node).params["healed"]))

    def open_faults(self) -> dict[int, list[str]]:
        """node -> the network faults it still has (what the test has not healed)."""
        net = self._net()
        return net.faulted() if net is not None else {}

    def _record(self, change: NetworkChange, **fields: Any) -> None:
        record_fault(self._target, change.kind,
                     **({"target_node": change.node} if change.node is not None else {}),
                     **change.params, **fields)

    def _store_peers(self, peers: str | Sequence[int]) -> str | Sequence[int]:
        """``peers="store"`` when node 0 hosts the store means node 0."""
        if peers == "store" and getattr(self._target.cluster, "store_host", "harness") == "node0":
            return [0]
        return peers
