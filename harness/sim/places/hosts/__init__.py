"""Hosts reached over SSH as the place a job's nodes run in (``harness.sim.places.seam``;
docs/hosts.md): each node's agent on a host of the hosts file, under that host's supervisor.

* ``place``: ``Hosts``, the cluster's place; ``nodes``: ``RemoteNodes`` (``job.place``), the
  job's nodes on their hosts, their agents, events, store and the end of it all;
* what a node there needs, each carried out on its host: ``network`` (nftables: cuts, loss),
  ``shaping`` (bandwidth), ``rules`` (the rule texts), ``cgroups`` (with ``cgroup_keeper``,
  the host's half, run there as ``python -m harness.sim.places.hosts.cgroup_keeper``),
  ``orders`` (exit-code orders), ``port`` (a port kept for node 0's store), ``script`` (a
  copied script), ``shared`` (the job's shared dir), ``gpus`` (each host's GPUs split);
* ``refusals``: what a host cannot carry out, in one line, and the chaos kinds it leaves out.

Imports nothing: the keeper runs on a host, and must not pay for the rest.
"""
