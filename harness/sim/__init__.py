"""The simulation layer: multi-node elastic jobs on one machine, and the faults that break them.

``harness.sim`` drives the runtime (``harness.agent``, ``harness.rendezvous``,
``harness.timer``, ``harness.procs``, ``harness.run``/``harness.launch``, ``harness.errors``,
``harness.events``, ``harness.endpoints``) through its public API, its CLI and the event stream
only; the runtime never imports this package. ``tests/unit/test_layers.py`` enforces both, and
that neither its modules nor its rooms import each other in a circle.

The rooms, bottom up (each imports only rooms below it):

* ``errors``, ``checks``, ``schema`` (leaves): the simulation's errors; the one definition of
  every option, fault kind and scenario key (``python -m harness.sim.schema``), and the checks
  it states them in; ``config``: ``ClusterConfig``, a cluster's settings, frozen;
* ``truth/``: what a job did and what it is judged by: ``progress`` (``report_step``, the line a
  worker adds), ``timeline``, ``training`` (goodput), ``invariants``, ``net_invariants``,
  ``hangs``, ``stacks``, ``job_result``, ``golden``/``twin``/``verdicts`` (the fault-free twin),
  ``digest``, ``projection`` (``project_goodput``: a job's fault cost at scale);
* ``leftovers``: what dead owners left (temp dirs by owner pid); ``bus``: the job's event bus;
* ``faults/``: faults and triggers as data (``harness.sim.faults``), the ``FaultTarget``
  protocol a part sees the job through (``faults.target``), the scheduler, chaos;
* ``storage/`` (the jobs' FUSE filesystem), ``net/`` (nodes as network hosts), ``nodes/``
  (node agents, the warm pool, the store, the ledger) and ``resources/`` (the nodes'
  cgroups): each the thing and the faults on it (``<room>.faults``: ``job.storage``,
  ``job.network``, ``job.processes``, ``job.resources``);
* ``waits``, ``job`` (``Job``: a face that hands each act to its room), ``cluster``
  (``Cluster``).

``harness.sim.project_goodput`` and ``Projection`` are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.sim.truth.projection import Projection, project_goodput

__all__ = ["Projection", "project_goodput"]


def __getattr__(name: str) -> Any:
    """Loaded on first use: a node agent imports ``harness.sim`` and must not pay for these."""
    if name in __all__:
        from harness.sim.truth import projection

        return getattr(projection, name)
    raise AttributeError(f"module 'harness.sim' has no attribute {name!r}")
