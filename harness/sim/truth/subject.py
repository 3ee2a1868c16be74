"""What the truth room needs of a job: the protocols its helpers are typed against.

``stacks`` (a hang's worker stacks), ``twin`` (the fault-free twin) and ``verdicts`` (the
invariants, the twin's comparison) each take the job; each sees it through a protocol here,
of exactly what it reads, so that no module of this room imports ``harness.sim.job`` or
``harness.sim.cluster`` (not even for an annotation): the room stands below the job, and the
job's face hands its calls down (``tests/unit/test_layers.py``). ``harness.sim.job.Job`` and
``harness.sim.cluster.Cluster`` are the implementations; mypy checks them where the job hands
itself over. A helper that needs more of the job adds it here (and to ``Job``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.events import EventWriter
    from harness.sim.config import ClusterConfig
    from harness.sim.truth.job_result import JobResult
    from harness.sim.truth.stacks import WorkerAccess
    from harness.sim.truth.timeline import Timeline

__all__ = ["Configured", "JudgedCluster", "JudgedJob", "Launched", "PlacedNode", "StackedJob", "Traced",
           "TwinCluster", "TwinRun"]


class Traced(Protocol):
    """A job as far as its events go (``twin.job_record``: its losses and digests)."""

    @property
    def timeline(self) -> Timeline: ...


class PlacedNode(Protocol):
    """A node's handle as far as the room reads it: how its workers are reached when its
    agent runs on a host."""

    @property
    def pid(self) -> int:
        """Its agent's pid (on its host, where it runs on one)."""
        ...

    def worker_access(self) -> WorkerAccess | None:
        """How its workers are reached (``stacks.WorkerAccess``); None: directly, from here."""
        ...


class StackedJob(Traced, Protocol):
    """The job as ``stacks.job_workers`` sees it: its nodes, their labels, their workers."""

    @property
    def nodes(self) -> Mapping[int, PlacedNode]:
        """node index -> its handle (on a host, its workers are reached through ``worker_access``)."""
        ...

    def node_name(self, node: int) -> str:
        """Node ``node``'s display label."""
        ...

    def worker_pids(self, node: int) -> dict[int, int]:
        """local_rank -> pid of node ``node``'s current workers (alive)."""
        ...


class TwinRun(Traced, Protocol):
    """The twin job as ``twin`` runs it: waited for, then read."""

    def wait(self, timeout: float = ...) -> JobResult: ...


class TwinCluster(Protocol):
    """The fault-free copy of the job's cluster: it launches the twin."""

    def launch(self, entrypoint: Callable[..., Any] | str, *args: Any, nodes: int | None = ...,
               module: bool = ...) -> TwinRun: ...


class Configured(Protocol):
    """A cluster as far as its settings go."""

    @property
    def config(self) -> ClusterConfig: ...


class JudgedCluster(Configured, Protocol):
    """The job's cluster as ``verdicts`` and ``twin`` see it."""

    @property
    def golden_cache(self) -> str | None:
        """Where twins' records are kept between runs (None: nowhere)."""
        ...

    def fault_free_copy(self) -> AbstractContextManager[TwinCluster]:
        """A cluster of the same settings, no chaos, ``golden`` on (closed by its ``with``)."""
        ...

    @property
    def backend(self) -> str:
        """The process-group backend its workers are given (``{backend}``)."""
        ...

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """The GPU ids node slot ``node`` gets (empty without GPUs)."""
        ...


class Launched(Protocol):
    """What a job runs: its id, its entrypoint (a script, a module or a callable) and args,
    and on how many nodes ``launch`` started it."""

    @property
    def run_id(self) -> str: ...

    @property
    def entrypoint(self) -> Callable[..., Any] | str: ...

    @property
    def args(self) -> Sequence[Any]: ...

    @property
    def module(self) -> bool: ...

    @property
    def launched_nodes(self) -> int:
        """The nodes ``launch`` started at once (the first round waits for them; the twin
        starts as many)."""
        ...


class JudgedJob(Traced, Launched, Protocol):
    """The job as ``verdicts`` and ``twin`` see it: what it ran, on what, and how it ended."""

    @property
    def cluster(self) -> JudgedCluster: ...

    @property
    def harness_events(self) -> EventWriter:
        """The harness's own events (the ``golden`` verdict goes there)."""
        ...

    def finished(self) -> bool:
        """Every node agent ended on its own."""
        ...

    def result(self) -> JobResult:
        """The nodes' results merged."""
        ...
