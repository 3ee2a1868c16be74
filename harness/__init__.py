"""pytest-elastic's engine, in two layers.

**The runtime** -- our torchelastic: what ``elastic-run`` runs, usable without the rest.
    ``harness.agent``       WorkerSpec, WorkerState, RunResult, the elastic agents, health check
    ``harness.settings``, ``harness.states``   the settings' defaults and rules; WorkerState
                            (leaves: the agent re-exports them)
    ``harness.rendezvous``  handler API; c10d (our TCPStore-wire store), static, etcd backends
    ``harness.timer``       expiration timers: local (queue) and file (FIFO) servers and clients
    ``harness.procs``       start/watch/stop worker processes, logs and tee, the zygote
    ``harness.errors``      @record, error files, ProcessFailure, ChildFailedError, and the
                            root of every error we raise on purpose (``ElasticError``)
    ``harness.events``      the event stream every agent writes (``HARNESS_EVENTS``)
    ``harness.endpoints``   ports and endpoints (``harness.net``: its deprecated alias)
    ``harness.selfpipe``    the self-pipe every select loop wakes on
    ``harness.launch``, ``harness.run``   LaunchConfig/elastic_launch and the CLI

**The simulation** -- ``harness.sim``: multi-node jobs on one machine and the faults that break
them (``Cluster``, ``Job``, faults, chaos, timeline, invariants). It drives the runtime only
through the runtime's public names, its CLI and its event stream; the runtime never imports
it (``tests/unit/test_layers.py`` enforces both directions).

Importing ``harness`` is cheap: every name below is loaded on first use, so the pytest plugin
can import ``harness.errors`` (the error root its own errors derive from) without paying for
the agent, the simulation or torch. A type checker sees the real classes through the
``TYPE_CHECKING`` imports (``py.typed`` then means something: ``harness.Cluster`` is a
class to mypy, not ``Any``); ``tests/unit/test_public_types.py`` type-checks a user file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.agent import RunResult
    from harness.errors import ConfigError, ElasticError
    from harness.sim.cluster import Cluster
    from harness.sim.config import ClusterConfig
    from harness.sim.errors import ClusterLeakError, InvariantViolation
    from harness.sim.job import Job
    from harness.sim.nodes.pool import WarmPool
    from harness.sim.truth.job_result import JobResult
    from harness.sim.truth.progress import report_checkpoint, report_step
    from harness.sim.truth.timeline import Timeline
    from harness.states import WorkerState

__all__ = [
    "Cluster", "ClusterConfig", "ClusterLeakError", "ConfigError", "ElasticError", "InvariantViolation", "Job",
    "JobResult", "RunResult", "Timeline", "WarmPool", "WorkerState", "report_checkpoint", "report_step",
]

#: where each public name lives; one line each, so the map is also the documentation
_LAZY = {
    "Cluster": "harness.sim.cluster",
    "ClusterConfig": "harness.sim.config",
    "ClusterLeakError": "harness.sim.errors",
    "ConfigError": "harness.errors",
    "ElasticError": "harness.errors",
    "InvariantViolation": "harness.sim.errors",
    "Job": "harness.sim.job",
    "JobResult": "harness.sim.truth.job_result",
    "RunResult": "harness.agent",
    "Timeline": "harness.sim.truth.timeline",
    "WarmPool": "harness.sim.nodes.pool",
    "WorkerState": "harness.states",
    "report_checkpoint": "harness.sim.truth.progress",
    "report_step": "harness.sim.truth.progress",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
