"""What the job needs of its cluster: the ``LaunchingCluster`` protocol.

``harness.sim.job.Job`` holds the cluster that launched it and hands it, through itself, to
the pieces its acts live in: its fault parts (``harness.sim.faults.target.ClusterOfJob``), a
node's start (``harness.sim.nodes.start.NodesCluster``) and its verdicts and twin
(``harness.sim.truth.subject.JudgedCluster``); each piece states what it reads of the cluster
in a protocol of its own room. This one is all of them at once, plus what the job itself reads
(the directory its own goes in, the network the cluster resolved), so that ``job.py`` names no
``Cluster`` (not even for an annotation) and ``harness.sim.cluster`` stays the only module
above the job (``tests/unit/test_layers.py``). ``harness.sim.cluster.Cluster`` is the
implementation; mypy checks it where ``Cluster.launch`` makes a ``Job``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from harness.sim.faults.target import ClusterOfJob
from harness.sim.nodes.start import NodesCluster
from harness.sim.truth.subject import JudgedCluster

if TYPE_CHECKING:
    from harness.sim.config import ClusterConfig
    from harness.sim.places import Place

__all__ = ["LaunchingCluster"]


class LaunchingCluster(ClusterOfJob, NodesCluster, JudgedCluster, Protocol):
    """The cluster as its job sees it (``harness.sim.cluster.Cluster``): what the job's parts
    (``ClusterOfJob``), a node's start (``NodesCluster``) and its verdicts (``JudgedCluster``)
    read of it, plus where the job's directory goes and which network the cluster resolved."""

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def directory(self) -> str:
        """The cluster's temp dir (each job's own goes inside it)."""
        ...

    @property
    def place(self) -> Place:
        """Where the cluster's jobs run their nodes (``harness.sim.places``)."""
        ...

    @property
    def network(self) -> str:
        """What ``config.network`` resolved to on this machine: "netns" or "loopback"."""
        ...
