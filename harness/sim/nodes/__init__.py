"""The nodes: each one a real agent process, how it starts and ends, and the faults on them.

* ``start``: how a job starts one node agent (its config, command, environment);
* ``process``: ``NodeProcess``, an agent's process as the harness holds it;
* ``main``: the node agent's program (``python -m harness.sim.nodes.main``; ``--json SPEC``
  on a host);
* ``remote``: ``RemoteNodes`` (``job.remote``), a job's nodes placed on hosts over SSH
  (``Cluster(hosts=[...])``): their agents, events, store and faults there;
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
