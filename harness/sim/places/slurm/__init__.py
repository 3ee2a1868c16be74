"""A Slurm allocation as the place a job's nodes run in (``harness.sim.places.seam``;
docs/slurm.md): each node's agent a job step on a node of the allocation.

* ``place``: ``Slurm``, the cluster's place: its allocation (ours or the caller's), its
  nodes as hosts, reached with ``harness.hosts.SrunHost``; a job's nodes there are the hosts'
  place's ``RemoteNodes`` with job steps for their channel and the store reached directly.

Imports nothing: what runs on a node must not pay for the rest.
"""
