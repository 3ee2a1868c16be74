"""The simulation layer: multi-node elastic jobs on one machine, and the faults that break them.

``harness.sim`` drives the runtime (``harness.agent``, ``harness.rendezvous``,
``harness.timer``, ``harness.procs``, ``harness.run``/``harness.launch``, ``harness.errors``,
``harness.events``, ``harness.endpoints``) through its public API, its CLI and the event stream
only; the runtime never imports this package. ``tests/unit/test_layers.py`` enforces both.

Modules: ``cluster`` (``Cluster``), ``config`` (``ClusterConfig``: its settings, frozen),
``job`` (``Job``, ``JobResult``), ``pool`` (``WarmPool``, the zygote and node server
clusters share by choice), ``node_main`` (a node's agent process), ``node_forks`` (node
agents forked from one interpreter that imported the runtime once), ``rendezvous_store``
(where the rendezvous store lives), ``scheduler`` (fires scheduled faults), ``faults``
(faults and triggers as data), ``fault_target`` (what a fault needs from a job),
``process_faults`` and ``network_faults`` (the job's parts that apply them:
``job.processes``, ``job.network``), ``node_ledger`` (what the harness did to each node and
how its agent ended), ``schema`` and ``checks`` (the one definition of every option, fault
kind and scenario key), ``chaos`` (seeded schedules), ``timeline``, ``invariants``, ``gpus``
(GPU slices per node), ``net`` (nodes as network hosts: namespaces on a bridge, and the
network's faults), ``labels`` (readable node labels), ``progress`` (``report_step``, the
line a worker adds) and ``bytecode`` (node agents import the runtime from bytecode),
``digest`` (training-state digests for the fault-free twin) and ``projection``
(``project_goodput``: a job's measured fault cost at scale).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.sim.projection import Projection, project_goodput

__all__ = ["Projection", "project_goodput"]


def __getattr__(name: str) -> Any:
    """Loaded on first use: a node agent imports ``harness.sim`` and must not pay for these."""
    if name in __all__:
        from harness.sim import projection

        return getattr(projection, name)
    raise AttributeError(f"module 'harness.sim' has no attribute {name!r}")
