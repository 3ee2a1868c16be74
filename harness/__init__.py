"""pytest-elastic's engine: an embedded elastic runtime and a fault-injection harness.

Importing ``harness`` is cheap: torch is imported only by code that needs it.
"""

from harness.agent import RunResult, WorkerState

__all__ = ["RunResult", "WorkerState"]
