"""This machine as the place a job's nodes run in (``harness.sim.places.seam``): every node
an agent forked by the warm pool's node server, in a network namespace of its own where the
cluster has them."""

from harness.sim.places.here.place import Here, HereJob

__all__ = ["Here", "HereJob"]
