"""The nodes: each one a real agent process, how it starts and ends, and the faults on them.

* ``start``: how a job starts one node agent (its config, command, environment);
* ``process``: ``NodeProcess``, an agent's process as the harness holds it;
* ``main``: the node agent's program (``python -m harness.sim.nodes.main``; ``--json SPEC``
  on a host);
* ``host_*``: what a node on a host over SSH needs of this room's (its network, orders,
  port, script, shared dir, GPUs, refusals); the hosts' place itself is
  ``harness.sim.places.hosts``;
* ``forks``: ``NodeForkServer``, node agents forked from one interpreter that imported the
  runtime (``python -m harness.sim.nodes.forks``);
* ``pool``: ``WarmPool``, the zygote, the node fork server and a standing-by filesystem
  server, shared across clusters;
* ``bytecode``: the runtime compiled once, so every node agent starts from bytecode;
* ``rendezvous_store``: where a multi-node job's store (or etcd) runs;
* ``ledger``: what the harness did to each node and how its agent ended (``job.ledger``);
* ``teardown``: what a job's end kills;
* ``gpus``: GPU slices per node; ``labels``: readable node labels;
* ``faults``: ``ProcessFaults`` (``job.processes``): signals to workers, agents, whole nodes
  and the store's host.

Imports nothing: a node agent imports ``main`` and must not pay for the rest.
"""
