"""What a fault needs from the job it acts on: the ``FaultTarget`` protocol.

A job's faults live in parts, one per kind of thing they break: ``job.processes``
(``harness.sim.nodes.faults``: signals to workers, agents, whole nodes and the store's
host), ``job.network`` (``harness.sim.net.faults``: cut, thinned and healed links),
``job.storage`` (``harness.sim.storage``: the job's filesystem) and ``job.resources``
(``harness.sim.resources``: the nodes' cgroups). Each part is a class constructed with the
job, typed as this protocol (no part module imports ``Job``), so that a part sees the few
things a fault touches and nothing of the job's waits, results or reports; a part that needs
more adds it here, and it never reads a ``_private`` field of the job or of its scheduler.
``harness.sim.job.Job`` is the implementation; the protocol is the contract between the two
(docs/architecture.md, "Adding a fault kind").
A fault kind's row (``harness.sim.schema.FaultKind.part``) names its part; ``Fault.apply``
calls the part's method of the kind's name.

A fault resolves its target first (``node`` raises ``ConfigError`` for a node the job does
not have; a part raises ``TargetNotReady`` for one that cannot take the fault now), so one
that cannot hit anything is never recorded as fired; then records its ``fault`` event under
its kind's name (``record_fault``); then acts. A part whose faults last until healed is also a
``LastingFaults``: ``Job.heal`` ends every such part's faults (``end_every``) and records one
``heal`` event.

The rest of this room sees the job through this door too: ``ScheduledJob`` is the job as the
scheduler, a trigger and ``Fault.apply`` see it (a ``FaultTarget``, plus its timeline, its
bus and the few questions a trigger asks). Neither names ``Job`` or ``Cluster``, so the fault
room stands below the job and the rooms whose parts it feeds (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.events import EventWriter
    from harness.hosts import HostSpec, SshHost
    from harness.sim.bus import EventBus
    from harness.sim.net import Network
    from harness.sim.nodes.ledger import NodeLedger
    from harness.sim.nodes.pool import WarmPool
    from harness.sim.nodes.process import NodeProcess
    from harness.sim.nodes.rendezvous_store import StoreHandle
    from harness.sim.truth.timeline import Timeline
    from harness.states import WorkerState

__all__ = ["ClusterOfJob", "Ended", "ExitOrders", "FaultTarget", "FaultsInFlight", "LastingFaults", "NodeHosts",
           "Refusals", "ScheduledJob", "SettingsOfJob", "StorageOfJob", "end_every", "record_fault"]


class SettingsOfJob(Protocol):
    """The cluster's settings a fault reads (``harness.sim.config.ClusterConfig``)."""

    @property
    def nproc_per_node(self) -> int: ...

    @property
    def min_nodes(self) -> int: ...

    @property
    def max_nodes(self) -> int: ...

    @property
    def store_host(self) -> str: ...

    @property
    def seed(self) -> int: ...


class ClusterOfJob(Protocol):
    """The job's cluster as a fault sees it (``harness.sim.cluster.Cluster``)."""

    @property
    def config(self) -> SettingsOfJob:
        """The settings (``nproc_per_node``, ``store_host``, ``seed``, the nodes' range)."""
        ...

    @property
    def pool(self) -> WarmPool:
        """The warm pool (a storage fault's filesystem server comes from it)."""
        ...


class StorageOfJob(Protocol):
    """The job's storage part as the rest of its faults see it (``StorageFaults``)."""

    def require(self, what: str) -> None:
        """``ConfigError`` naming what is missing, where the filesystem is a plain directory."""
        ...

    def crash(self, node: int, torn: bool = False) -> list[dict[str, Any]]:
        """Roll back what node ``node`` wrote and never fsynced; what was lost, per file."""
        ...

    def file_seen(self, trigger: object, glob: str, node: int | None) -> bool:
        """Whether a file matching ``glob`` was created or renamed (by ``node``) since
        ``trigger`` (an ``OnFile``, known by its identity) was armed."""
        ...


class NodeHosts(Protocol):
    """Where a job's nodes run when on hosts (``RemoteNodes``): a node's host, and its
    connection; what the parts that carry their faults out there see (their cgroups, disks)."""

    def host_of(self, node: int) -> HostSpec: ...

    def connection(self, node: int) -> tuple[SshHost, int | None]: ...


class Refusals(Protocol):
    """The job's place as its faults see it (``harness.sim.places.seam.JobPlace``): what
    it cannot carry out is refused before it is armed or applied, in one line."""

    def refuse(self, entries: Sequence[Any]) -> None:
        """``FaultRefused`` for the first of ``entries`` (``ScheduledFault``s) the place
        cannot carry out."""
        ...

    def guarded(self, kind: str, act: Callable[..., Any]) -> Callable[..., Any]:
        """``act`` (the part's method of ``kind``), refused first as a scheduled fault
        of the same fields would be."""
        ...


class FaultsInFlight(Protocol):
    """The job's scheduler as a part sees it (``FaultScheduler``)."""

    def await_applied(self, trigger: object, timeout: float) -> bool:
        """Sleep until the fault of ``trigger`` (just met; known by its identity) is no
        longer in flight, at most ``timeout`` s; whether it settled."""
        ...


class FaultTarget(Protocol):
    """The job as its fault parts see it."""

    #: the job's id (its cgroups and its filesystem are named by it)
    run_id: str
    #: the job's own temp dir (its filesystem's backing store lives in it)
    directory: str
    #: the job's event file (the filesystem's server writes its events there too)
    events_path: str
    #: node index -> its agent's handle (pid, popen, directory), every node ever started
    nodes: dict[int, NodeProcess]
    #: the nodes' network (built with the first node)
    net: Network
    #: the job's rendezvous store as the harness holds it (None: a one-node job's agent
    #: hosts its own)
    store: StoreHandle | None
    #: where exit-code orders are left for workers (``harness.report_step`` obeys them)
    orders_dir: str
    #: the harness's own event writer (events that are no fault: ``fault_armed``)
    harness_events: EventWriter
    #: what the harness did to each node and how each agent ended: a fault that ends or
    #: stops a node says so first (``ledger.harm(i, kind)``), then waits for the end it
    #: caused (``ledger.await_exit(i)``, ``ledger.await_frozen(i)``)
    ledger: NodeLedger

    @property
    def cluster(self) -> ClusterOfJob:
        """The job's cluster: its settings (``cluster.config``: ``nproc_per_node``,
        ``store_host``, ``seed``...) and its ``pool``."""
        ...

    @property
    def storage(self) -> StorageOfJob:
        """The job's filesystem and storage faults (``harness.sim.storage``): a node crash
        that loses unsynced writes asks it."""
        ...

    @property
    def scheduler(self) -> FaultsInFlight:
        """Fires the job's scheduled faults: a file operation that meets an ``OnFile``
        trigger is held until its fault was applied (``scheduler.await_applied``)."""
        ...

    def node(self, node: int) -> NodeProcess:
        """Node ``node``'s handle; ``ConfigError`` naming the valid nodes if it has none."""
        ...

    def worker_starts(self, node: int) -> dict[int, dict[str, Any]]:
        """local_rank -> the latest ``worker_start`` event of each of node ``node``'s workers."""
        ...

    def worker_pids(self, node: int) -> dict[int, int]:
        """local_rank -> pid of node ``node``'s current workers (alive)."""
        ...

    def record(self, event: str, **fields: Any) -> None:
        """Write the event of something the harness does to the job (a ``fault``, a
        ``heal``); a scheduled fault fires atomically with the write."""
        ...

    def start_node(self) -> int:
        """Start one more node agent (a join); its index."""
        ...


class ExitOrders(Protocol):
    """The process part as the scheduler sees it (``ProcessFaults``)."""

    def order_exit_at(self, rank: int, step: int, exit_code: int, what: str) -> None:
        """Rank ``rank`` exits with ``exit_code`` when it reports step ``step``."""
        ...


class ScheduledJob(FaultTarget, Protocol):
    """The job as its scheduler, the triggers and ``Fault.apply`` see it: what its parts
    see, plus what a trigger waits on. ``Fault.apply`` reaches the part its row names by
    that name (``job.processes``...), as data, not through this type."""

    @property
    def timeline(self) -> Timeline:
        """The job's events (steps, rendezvous rounds: what triggers wait for)."""
        ...

    @property
    def bus(self) -> EventBus:
        """The job's event bus: the scheduler sleeps on it."""
        ...

    @property
    def processes(self) -> ExitOrders:
        """The process part: an exact (rank, step) crash is an order a worker obeys."""
        ...

    @property
    def place(self) -> Refusals:
        """Where its nodes run: what that place cannot carry out is refused when scheduled."""
        ...

    def in_state(self, state: WorkerState, node: int | None = None) -> bool:
        """Whether ``node`` (None: every running node) is in ``state`` with live workers."""
        ...

    def first_healthy_time(self) -> float | None:
        """When the job was first seen HEALTHY (monotonic); None: not yet."""
        ...

    def heal(self, node: int | None = None, at_end: bool = False) -> None:
        """End node ``node``'s lasting faults (every node's with None), one ``heal`` event
        (``at_end``: chaos's, because the job ends)."""
        ...


@dataclass(frozen=True)
class Ended:
    """What one part's heal ended: the fault names (the ``heal`` event's ``healed=[...]``)
    and any fields the part adds to that event (the storage part: which disk had which)."""

    names: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


class LastingFaults(Protocol):
    """A part whose faults last until healed; ``Job.heal`` calls each such part."""

    def end_lasting(self, node: int | None) -> Ended:
        """End node ``node``'s faults of this part (every node's, and the part's shared
        ones, with None) without recording anything; what ended (``Ended()``: nothing).
        ``Job.heal`` records every part's in its one ``heal`` event."""
        ...

    def open_faults(self) -> dict[Any, list[str]]:
        """Where (a node; a disk) -> the faults of this part still in place there (what a
        test has not healed)."""
        ...


def end_every(parts: Iterable[LastingFaults], node: int | None) -> Ended:
    """End node ``node``'s faults (every node's with None) of each of ``parts``; all that
    ended, in one ``Ended`` (``Job.heal`` records it). A part that cannot heal here (the
    network in loopback mode: ``ConfigError``) is passed over, and its refusal raised only
    when no part healed anything: ``heal()`` in loopback mode still ends a slow node."""
    names: list[str] = []
    detail: dict[str, Any] = {}
    refused: list[ConfigError] = []
    for part in parts:
        try:
            ended = part.end_lasting(node)
        except ConfigError as e:
            refused.append(e)
            continue
        names += ended.names
        detail.update(ended.detail)
    if refused and not names:
        raise refused[0]
    return Ended(sorted(names), detail)


def record_fault(target: FaultTarget, kind: str, **fields: Any) -> None:
    """Record a fault about to be applied (its target already resolved): the ``fault``
    event, named by ``kind`` (the fault's kind, as its row spells it: reports and the
    invariants look it up there); a scheduled one leaves ``pending_faults()`` atomically
    with this write."""
    target.record("fault", fault=kind, **fields)
