"""Hosts reached over SSH as the place a job's nodes run in (``harness.sim.places.seam``;
docs/hosts.md): each node's agent on a host of the hosts file, under that host's supervisor."""

from harness.sim.places.hosts.place import Hosts

__all__ = ["Hosts"]
