"""The simulation layer: multi-node elastic jobs on one machine, and the faults that break them.

``harness.sim`` drives the runtime (``harness.agent``, ``harness.rendezvous``,
``harness.timer``, ``harness.procs``, ``harness.run``/``harness.launch``, ``harness.errors``,
``harness.events``, ``harness.net``) through its public API, its CLI and the event stream
only; the runtime never imports this package. ``tests/unit/test_layers.py`` enforces both.

Modules: ``cluster`` (``Cluster``, ``Job``, ``JobResult``), ``node_main`` (a node's agent
process), ``stores`` (where the rendezvous store lives), ``faults`` (faults and triggers as
data), ``chaos`` (seeded schedules), ``timeline``, ``invariants``, ``gpus`` (GPU slices per
node) and ``progress`` (``report_step``, the line a worker adds).
"""
