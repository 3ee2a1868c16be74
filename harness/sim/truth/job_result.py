"""A job's outcome: its node agents' results merged into one ``JobResult``.

Each node agent pickles its ``RunResult`` when it finishes (``NodeProcess.result``, seen here
as a ``FinishedNode``: all merging needs of a node's process); a node
the harness killed, or one still running, has none, and so does not count. The job
succeeded when some node's workers succeeded and no node's failed: one node that ran out of
restarts fails the whole job, whatever the others saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.agent import RunResult
from harness.errors import ProcessFailure
from harness.states import WorkerState

__all__ = ["FinishedNode", "JobResult", "merge_results"]


class _Exits(Protocol):
    def poll(self) -> int | None: ...


class FinishedNode(Protocol):
    """A node's agent as merging sees it (``harness.sim.nodes.process.NodeProcess``)."""

    @property
    def popen(self) -> _Exits: ...

    def result(self) -> RunResult | None:
        """The agent's ``RunResult``; None while it runs, or when it was killed."""
        ...


@dataclass
class JobResult:
    """The whole job's outcome, merged over the nodes whose agents finished."""

    state: WorkerState
    run_results: dict[int, RunResult] = field(default_factory=dict)
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state == WorkerState.FAILED


def merge_results(nodes: Mapping[int, FinishedNode]) -> JobResult:
    """One ``JobResult`` from every node's: the return values and failures of all ranks,
    each agent's exit code (None: still running)."""
    run_results = {i: r for i, n in nodes.items() if (r := n.result()) is not None}
    exit_codes = {i: n.popen.poll() for i, n in nodes.items()}
    failed = any(r.is_failed() for r in run_results.values())
    succeeded = any(r.state == WorkerState.SUCCEEDED for r in run_results.values())
    state = WorkerState.SUCCEEDED if succeeded and not failed else WorkerState.FAILED
    values: dict[int, Any] = {}
    failures: dict[int, ProcessFailure] = {}
    for result in run_results.values():
        values.update(result.return_values)
        failures.update(result.failures)
    return JobResult(state, run_results, values, failures, exit_codes)
