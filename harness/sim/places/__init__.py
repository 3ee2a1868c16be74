"""Where a job's nodes run: the seam (``seam``: ``Place``, ``JobPlace``) and its places, one
room each: ``here`` (this machine), ``hosts`` (hosts over SSH) and ``slurm`` (the nodes of a
Slurm allocation, each agent a job step). ``place_of`` picks a
cluster's from its settings; fault code asks the job's place, never where it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.sim.places.seam import GpuSplit, JobPlace, Place

if TYPE_CHECKING:
    from harness.sim.config import ClusterConfig

__all__ = ["GpuSplit", "JobPlace", "Place", "place_of"]


def place_of(config: ClusterConfig) -> Place:
    """The place ``config``'s jobs run their nodes in: its Slurm allocation, its hosts, else
    this machine (a place's room, and what it reaches nodes with, imported only where a
    cluster has that place)."""
    if config.slurm is not None:
        from harness.sim.places.slurm.place import Slurm

        return Slurm(config)
    if config.hosts is not None:
        from harness.sim.places.hosts.place import Hosts

        return Hosts(config)
    from harness.sim.places.here import Here

    return Here(config)
