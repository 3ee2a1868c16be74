"""``WorkerState``: the states of a worker group, as agents report them and tests wait on them.

A leaf: it imports nothing of the harness, so what only names a state (the simulation's
schema, the pytest plugin's help, a timeline) need not load the agent. ``harness.agent``
re-exports it (``harness.agent.WorkerState`` is this class), and so does ``harness``.
"""

from __future__ import annotations

import enum

__all__ = ["WorkerState"]


class WorkerState(str, enum.Enum):
    """State of a worker group; the group changes state as a unit.

    INIT -> HEALTHY|UNHEALTHY -> SUCCEEDED|FAILED, with STOPPED when the agent interrupts
    the group to restart it; UNKNOWN when the agent lost track (unrecoverable).
    """

    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @staticmethod
    def is_running(state: WorkerState) -> bool:
        return state in (WorkerState.HEALTHY, WorkerState.UNHEALTHY)
