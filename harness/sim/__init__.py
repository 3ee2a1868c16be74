"""The simulation layer: multi-node elastic jobs on one machine, and the faults that break them.

``harness.sim`` drives the runtime (``harness.agent``, ``harness.rendezvous``,
``harness.timer``, ``harness.procs``, ``harness.run``/``harness.launch``, ``harness.errors``,
``harness.events``, ``harness.net``) through its public API, its CLI and the event stream
only; the runtime never imports this package. ``tests/unit/test_layers.py`` enforces both.

Modules: ``cluster`` (``Cluster``), ``job`` (``Job``, ``JobResult``), ``pool`` (``WarmPool``,
the zygote and node server clusters share by choice), ``node_main`` (a node's agent
process), ``node_forks`` (node agents forked from one interpreter that imported the
runtime once), ``stores``
(where the rendezvous store lives), ``scheduler`` (fires scheduled faults), ``faults`` (faults
and triggers as data), ``schema`` and ``checks`` (the one definition of every option, fault
kind and scenario key), ``chaos`` (seeded schedules), ``timeline``, ``invariants``, ``gpus``
(GPU slices per node), ``net`` (nodes as network hosts: namespaces on a bridge, and the
network's faults), ``labels`` (readable node labels), ``progress`` (``report_step``, the line a worker adds) and
``bytecode`` (node agents import the runtime from bytecode).
"""
