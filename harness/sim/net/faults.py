"""A job's network faults (``job.network``): cut, thin and heal the links of nodes.

Each node of a ``Cluster(network="netns")`` is a network host (``harness.sim.net``). These
methods apply a fault to the job's ``Network`` (``job.net``) and record it on the timeline
as a ``fault`` event (its start); ``Job.heal`` ends them (``end_lasting``) and records a
``heal`` event naming what ended, so reports draw a fault that lasts as a span and the
invariant checker can tell whether every partition the test made was healed. In loopback
mode every one of them raises a ``ConfigError`` that names what is missing (network
namespaces, root).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.sim.faults.target import Ended, record_fault

if TYPE_CHECKING:
    from harness.sim.faults.target import FaultTarget
    from harness.sim.net.network import NetworkChange

__all__ = ["NetworkFaults"]


class NetworkFaults:
    """The network faults of one job (``job.network``); they last until ``Job.heal``."""

    def __init__(self, target: FaultTarget):
        self._target = target

    def address(self, node: int) -> str:
        """Node ``node``'s IP address: inside 198.18.0.0/15 with ``network="netns"`` (in
        namespaces the harness made), a 127.0.1.x address in loopback mode."""
        self._target.node(node)
        return self._target.net.address(node)

    def partition(self, node: int, peers: str | Sequence[int] = "all", direction: str = "both") -> None:
        """Silently drop node ``node``'s packets to and from ``peers`` ("all", "store" --
        the rendezvous store -- or a list of nodes); ``direction`` "in" or "out" cuts one
        way only. No RST, no FIN: the others learn nothing until their timeouts say so."""
        self._target.node(node)
        peers = peers if isinstance(peers, str) else list(peers)  # a spec's tuple, a TOML array
        self._record(self._target.net.partition(node, peers=self._store_peers(peers), direction=direction))

    def packet_loss(self, node: int, probability: float) -> None:
        """Drop each of node ``node``'s packets with ``probability`` (0..1), both ways."""
        self._target.node(node)
        self._record(self._target.net.packet_loss(node, probability))

    def bandwidth(self, node: int, rate: str | int) -> None:
        """Limit node ``node``'s link to ``rate`` (e.g. "1mbit", or bits per second)."""
        self._target.node(node)
        self._record(self._target.net.bandwidth(node, rate))

    def link_down(self, node: int) -> None:
        """Unplug node ``node``'s cable: its interface loses carrier (until healed)."""
        self._target.node(node)
        self._record(self._target.net.link_down(node))

    # -- lasting faults (``LastingFaults``) ------------------------------------------------

    def end_lasting(self, node: int | None) -> Ended:
        """End node ``node``'s network faults (partitions, loss, bandwidth, link down), or
        every node's with None; what ended. Loopback mode: ``ConfigError`` (nothing to heal)."""
        return Ended(list(self._target.net.heal(node).params["healed"]))

    def open_faults(self) -> dict[int, list[str]]:
        """node -> the network faults it still has (what the test has not healed)."""
        net = self._target.net
        return net.faulted() if net is not None and net.mode == "netns" else {}

    def _record(self, change: NetworkChange, **fields: Any) -> None:
        record_fault(self._target, change.kind,
                     **({"target_node": change.node} if change.node is not None else {}),
                     **change.params, **fields)

    def _store_peers(self, peers: str | Sequence[int]) -> str | Sequence[int]:
        """``peers="store"`` when node 0 hosts the store means node 0."""
        if peers == "store" and getattr(self._target.cluster, "store_host", "harness") == "node0":
            return [0]
        return peers
