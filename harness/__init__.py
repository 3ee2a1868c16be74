"""pytest-elastic's engine, in two layers.

**The runtime** -- our torchelastic: what ``elastic-run`` runs, usable without the rest.
    ``harness.agent``       WorkerSpec, WorkerState, RunResult, the elastic agents, health check
    ``harness.rendezvous``  handler API; c10d (our TCPStore-wire store), static, etcd backends
    ``harness.timer``       expiration timers: local (queue) and file (FIFO) servers and clients
    ``harness.procs``       start/watch/stop worker processes, logs and tee, the zygote
    ``harness.errors``      @record, error files, ProcessFailure, ChildFailedError
    ``harness.events``      the event stream every agent writes (``HARNESS_EVENTS``)
    ``harness.net``         ports and endpoints
    ``harness.launch``, ``harness.run``   LaunchConfig/elastic_launch and the CLI

**The simulation** -- ``harness.sim``: multi-node jobs on one machine and the faults that break
them (``Cluster``, ``Job``, faults, chaos, timeline, invariants). It drives the runtime only
through the runtime's public names, its CLI and its event stream; the runtime never imports
it (``tests/unit/test_layers.py`` enforces both directions).

Importing ``harness`` is cheap: torch is imported only by code that needs it, and the
simulation is loaded on first use of a name below.
"""

from typing import Any

from harness.agent import RunResult, WorkerState

__all__ = ["Cluster", "Job", "JobResult", "RunResult", "Timeline", "WarmPool", "WorkerState", "report_step"]

_LAZY = {"Cluster": "harness.sim.cluster", "Job": "harness.sim.job", "JobResult": "harness.sim.job",
         "Timeline": "harness.sim.timeline", "WarmPool": "harness.sim.pool", "report_step": "harness.sim.progress"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
