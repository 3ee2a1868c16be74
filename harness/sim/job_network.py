"""A job's network faults: the ``Job`` methods that cut, thin and heal the links of nodes.

Each node of a ``Cluster(network="netns")`` is a network host (``harness.sim.net``). These
methods apply a fault to the job's ``Network`` and record it on the timeline as a ``fault``
event (its start) and, when healed, a ``heal`` event naming what ended, so reports draw a
fault that lasts as a span and the invariant checker can tell whether every partition the
test made was healed. In loopback mode every one of them raises a ``ConfigError`` that
names what is missing (network namespaces, root).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.sim.net import Network, NetworkChange

__all__ = ["NetworkFaults"]


class NetworkFaults:
    """Mixed into ``Job``: needs ``network``, ``cluster``, ``_node(i)``, ``_fault(...)`` and
    ``_record_action(...)``."""

    network: Network
    cluster: Any

    def _node(self, node: int) -> Any:  # provided by Job
        raise NotImplementedError

    def _fault(self, kind: str, **fields: Any) -> None:  # provided by Job
        raise NotImplementedError

    def _record_action(self, event: str, **fields: Any) -> None:  # provided by Job
        raise NotImplementedError

    def _record(self, change: NetworkChange, **fields: Any) -> None:
        self._fault(change.kind, **({"target_node": change.node} if change.node is not None else {}),
                    **change.params, **fields)

    def node_address(self, node: int) -> str:
        """Node ``node``'s IP address: inside 198.18.0.0/15 with ``network="netns"`` (in
        namespaces the harness made), a 127.0.1.x address in loopback mode."""
        self._node(node)
        return self.network.address(node)

    def partition(self, node: int, peers: str | Sequence[int] = "all", direction: str = "both") -> None:
        """Silently drop node ``node``'s packets to and from ``peers`` ("all", "store" --
        the rendezvous store -- or a list of nodes); ``direction`` "in" or "out" cuts one
        way only. No RST, no FIN: the others learn nothing until their timeouts say so."""
        self._node(node)
        self._record(self.network.partition(node, peers=self._store_peers(peers), direction=direction))

    def heal(self, node: int | None = None) -> None:
        """End node ``node``'s network faults (partitions, loss, bandwidth, link down), or
        every node's with ``node=None``."""
        if node is not None:
            self._node(node)
        change = self.network.heal(node)
        self._record_action("heal", **({"target_node": node} if node is not None else {}), **change.params)

    def packet_loss(self, node: int, probability: float) -> None:
        """Drop each of node ``node``'s packets with ``probability`` (0..1), both ways."""
        self._node(node)
        self._record(self.network.packet_loss(node, probability))

    def bandwidth(self, node: int, rate: str | int) -> None:
        """Limit node ``node``'s link to ``rate`` (e.g. "1mbit", or bits per second)."""
        self._node(node)
        self._record(self.network.bandwidth(node, rate))

    def link_down(self, node: int) -> None:
        """Unplug node ``node``'s cable: its interface loses carrier (until ``heal``)."""
        self._node(node)
        self._record(self.network.link_down(node))

    def open_network_faults(self) -> dict[int, list[str]]:
        """node -> the network faults it still has (what the test has not healed)."""
        return self.network.faulted() if self.network.mode == "netns" else {}

    def _store_peers(self, peers: str | Sequence[int]) -> str | Sequence[int]:
        """``peers="store"`` when node 0 hosts the store means node 0."""
        if peers == "store" and getattr(self.cluster, "store_host", "harness") == "node0":
            return [0]
        return peers
