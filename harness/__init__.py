"""pytest-elastic's engine: an embedded elastic runtime and a fault-injection harness.

Importing ``harness`` is cheap: torch is imported only by code that needs it, and the
simulation (``Cluster``...) is loaded on first use.
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
