"""A running simulated job: the face a test holds (``cluster.launch(...)`` returns one).

``Job`` holds the job's state and the logic of none of its acts: each lives in a module of
its own (in the rooms of ``harness.sim``) and a method here hands the call on, so that the
face stays small enough to read and each piece can be read alone.

* nodes: its ``place`` (``harness.sim.places``: this machine, hosts) starts an agent; ``ledger``
  records what the harness did to each node and how its agent ended (a killed node: FAILED);
* faults: the parts ``processes``, ``network``, ``storage`` and ``resources`` (``nodes.faults``,
  ``net.faults``, ``storage.faults``, ``resources.faults``) act on the job as a ``FaultTarget``
  (``faults.target``); the public fault methods are theirs, handed on (``faults.methods``);
  ``faults.scheduler`` fires scheduled ones; ``heal`` ends the lasting ones of every part;
* waits: ``waits``; verdicts: ``truth.verdicts``; the result and the end: ``truth.job_result``,
  ``nodes.teardown``.

A node is named by its integer index everywhere; its generated name is a display label.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError
from harness.events import EventWriter
from harness.procs import STACKS_ENV
from harness.sim import waits
from harness.sim.bus import EventBus
from harness.sim.errors import FaultError
from harness.sim.faults import Fault, Immediately, ScheduledFault, Trigger
from harness.sim.faults.methods import hand_off
from harness.sim.faults.scheduler import FaultScheduler
from harness.sim.faults.target import end_every
from harness.sim.net import Network
from harness.sim.net.faults import NetworkFaults
from harness.sim.nodes.faults import ProcessFaults
from harness.sim.nodes.ledger import NodeLedger
from harness.sim.nodes.process import NodeProcess
from harness.sim.nodes.scheduler import SchedulerFaults
from harness.sim.nodes.start import agent_log, rendezvous_settings
from harness.sim.nodes.teardown import fifos_under, kill_all, survivors
from harness.sim.resources import ResourceFaults
from harness.sim.schema import deprecated
from harness.sim.storage.faults import StorageFaults
from harness.sim.truth import verdicts
from harness.sim.truth.invariants import InvariantViolation
from harness.sim.truth.job_result import JobResult, merge_results
from harness.sim.truth.timeline import HARNESS, Timeline
from harness.states import WorkerState

if TYPE_CHECKING:
    from harness.sim.faults.target import LastingFaults
    from harness.sim.nodes.rendezvous_store import StoreHandle
    from harness.sim.places import JobPlace
    from harness.sim.truth.golden import GoldenDiff
    from harness.sim.truth.training import Goodput
    from harness.sim.views import LaunchingCluster

__all__ = ["Job", "JobResult", "NodeProcess", "FaultError", "fifos_under"]


class Job:
    """A running job: its nodes, its faults, its waits, its verdicts and its end (module doc)."""

    def __init__(self, cluster: LaunchingCluster, entrypoint: Callable[..., Any] | str, args: list[Any], module: bool):
        self.cluster: LaunchingCluster = cluster
        self.entrypoint = entrypoint
        self.args = args
        self.module = module
        self.run_id = uuid.uuid4().hex[:12]
        self.directory = tempfile.mkdtemp(prefix=f"job_{self.run_id}_", dir=cluster.directory)
        self.events_path = os.path.join(self.directory, "events.jsonl")
        open(self.events_path, "ab").close()
        self.timeline = Timeline(self.events_path)
        self.bus = EventBus(self.timeline, self.directory)
        self.nodes: dict[int, NodeProcess] = {}
        self.orders_dir = os.path.join(self.directory, "orders")
        os.makedirs(self.orders_dir)
        #: where the workers dump their Python stacks on SIGUSR1 (``harness.sim.truth.stacks``):
        #: the pytest session's directory, else the job's own
        self.stacks_dir = os.environ.get(STACKS_ENV) or os.path.join(self.directory, "stacks")
        os.makedirs(self.stacks_dir, exist_ok=True)
        self.scheduler = FaultScheduler(self)  # fires scheduled faults (a thread from the first on)
        self.chaos_schedule: list[ScheduledFault] = []  # chaos's faults: they may never fire
        self.place: JobPlace = (place := cluster.place.open(self))  # where its nodes run: this machine, hosts...
        self.storage = StorageFaults(self, self.place.disk_servers)  # the job's filesystem (FUSE, where it can be)
        #: the job's own shared filesystem (checkpoints): ``{shared}`` in the args, and
        #: ``HARNESS_SHARED_DIR`` in every worker; fresh for every job (a twin gets its own)
        self.shared_dir = self.storage.shared_dir
        self.launched_nodes = 0  # nodes ``launch`` started (the twin starts as many)
        #: the harness's own events (node starts and exits, faults, heals), in the job's file
        self.harness_events = EventWriter(self.events_path, HARNESS, self.run_id, wake=self.bus.wake_path)
        #: what the harness did to each node and how each agent ended (``reap_timeout``: how
        #: long a kill waits for the agent it killed to be reaped)
        self.ledger = NodeLedger(self.nodes, self.timeline, self.harness_events, self.bus)
        self._rdzv: dict[str, Any] | None = None
        self.store: StoreHandle | None = None  # the rendezvous store the harness runs (None: a node hosts it)
        self.net: Network = None  # type: ignore[assignment]  # built with the first node (the store's too)
        self.processes = ProcessFaults(self, place.orders)  # the parts: each what it needs of the place
        self.network, self.resources = NetworkFaults(self, lambda: place.network), ResourceFaults(self, place.cgroups)
        self.slurm = SchedulerFaults(self, place.scheduler)
        self.lasting: list[LastingFaults] = [self.network, self.resources, self.storage, self.slurm]  # heal ends them
        self.killed_nodes: set[int] = set()  # nodes whose agents terminate() had to SIGKILL
        self.close_warnings: list[Warning] = []  # unhealed faults: Cluster.close warns once all is closed
        self.released: list[str] | None = None  # what would not die at the release of the finished job (None: not yet)

    # -- nodes ---------------------------------------------------------------------------

    def start_node(self) -> int:
        """Start one more node agent (``launch``'s nodes, and ``add_node``'s); its index."""
        if self.net is None:  # every node slot's host at once (on hosts: the store's, on loopback)
            self.net = Network(self.cluster.config.max_nodes, self.cluster.place.network_mode(self.cluster.network))
        if self._rdzv is None:  # the store lives in the network: after it
            self._rdzv, self.store = rendezvous_settings(self)
        index = len(self.nodes)
        node = self.place.start(index, self._rdzv)
        self.nodes[node.index] = node
        self.harness_events.emit("node_start", target_node=node.index, label=node.name, pid=node.pid,
                                 addr=node.addr, slot=node.slot, **node.placed())
        self.ledger.watch(node.index)
        return node.index

    def node(self, node: int) -> NodeProcess:
        """Node ``node``'s handle; ``ConfigError`` naming the valid nodes if it has none."""
        try:
            return self.nodes[node]
        except (KeyError, TypeError):
            raise ConfigError("node", node, f"is not one of this job's nodes {sorted(self.nodes)}") from None

    def node_name(self, node: int) -> str:
        """Node ``node``'s display label (the same as ``timeline.label(node)``)."""
        return self.node(node).name

    def node_disk(self, node: int) -> str:
        """Node ``node``'s local disk: ``{node_disk}`` in its args, ``HARNESS_NODE_DISK`` in its workers."""
        self.node(node)  # an unknown node raises, naming the valid ones
        return self.storage.disk_of(node)

    def node_address(self, node: int) -> str:
        """Node ``node``'s IP address (inside 198.18.0.0/15 with ``network="netns"``; its host's on one)."""
        return self.place.address(self.node(node).index)  # an unknown node raises, naming the valid ones

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """The ``CUDA_VISIBLE_DEVICES`` ids node ``node`` was given (empty without GPUs)."""
        return self.node(node).gpus

    def agent_log(self, node: int) -> str:
        """What node ``node``'s agent wrote to its log (its stdout and stderr)."""
        return agent_log(self.node(node))

    def worker_starts(self, node: int) -> dict[int, dict[str, Any]]:
        """local_rank -> the latest ``worker_start`` event of each of the node's workers."""
        if not self.timeline.knows(self.node(node).index):  # started on another thread: its node_start comes next
            return {}
        # time-ordered: the last start of each rank wins
        return {start["local_rank"]: start for start in self.timeline.events("worker_start", node)}

    def worker_pids(self, node: int) -> dict[int, int]:
        """local_rank -> pid of the node's current workers (alive, same process as started)."""
        return self.node(node).live_workers(self.worker_starts(node))

    # -- faults: the public ones are the parts' own methods, handed on (one line per public row)

    kill_worker = hand_off(ProcessFaults.kill_worker)
    hang_worker = hand_off(ProcessFaults.hang_worker)
    kill_agent = hand_off(ProcessFaults.kill_agent)
    kill_node = hand_off(ProcessFaults.kill_node)
    remove_node = hand_off(ProcessFaults.remove_node)
    add_node = hand_off(ProcessFaults.add_node)
    freeze_node = hand_off(ProcessFaults.freeze_node)
    kill_store_host = hand_off(ProcessFaults.kill_store_host)
    partition = hand_off(NetworkFaults.partition)
    packet_loss = hand_off(NetworkFaults.packet_loss)
    bandwidth = hand_off(NetworkFaults.bandwidth)
    link_down = hand_off(NetworkFaults.link_down)
    slow_node = hand_off(ResourceFaults.slow_node)
    memory_limit = hand_off(ResourceFaults.memory_limit)
    disk_full = hand_off(StorageFaults.disk_full)
    slow_io = hand_off(StorageFaults.slow_io)
    io_error = hand_off(StorageFaults.io_error)

    def join_node(self) -> int:
        """Deprecated spelling of ``add_node``."""
        deprecated("Job.join_node", "Job.add_node", "method")
        return self.add_node()

    def heal(self, node: int | None = None, at_end: bool = False) -> None:
        """End node ``node``'s lasting faults (every node's, disk's and the shared filesystem's
        with None), of each part in ``lasting``; one ``heal`` event names what ended (``end_every``:
        loopback's network refuses; ``at_end``: chaos's, come because the job ends)."""
        if node is not None:
            self.node(node)  # an unknown node raises first
        ended = end_every(self.lasting, node)
        self.record("heal", **({"target_node": node} if node is not None else {}), healed=ended.names,
                    **ended.detail, **({"at_end": True} if at_end else {}))

    def record(self, event: str, **fields: Any) -> None:
        """Write the event of something the harness does to the job (a ``fault``, a
        ``heal``); a scheduled action fires atomically with the write."""
        with self.scheduler.recording() as origin:
            self.harness_events.emit(event, **fields, **origin)

    def inject(self, fault: Fault, trigger: Trigger | None = None) -> None:
        """Schedule ``fault`` to fire when ``trigger`` (default: now) is met."""
        self.schedule([ScheduledFault(fault, trigger or Immediately())])

    def schedule(self, entries: list[ScheduledFault]) -> None:
        """Arm a list of scheduled faults, fired in the background when due: all, or none
        (``ConfigError`` for one naming a node or rank this job can never have, or a host cannot
        do). One that cannot be applied makes the waits raise ``FaultError``; one never fired, ``wait``."""
        self.scheduler.schedule(entries)

    def pending_faults(self) -> list[ScheduledFault]:
        """Scheduled faults armed (or waiting for their predecessor), not fired yet."""
        return self.scheduler.pending()

    def failed_faults(self) -> list[tuple[ScheduledFault, str]]:
        """(entry, reason) of the scheduled faults that could not be applied (never fired)."""
        return self.scheduler.failures()

    def unfired_faults(self) -> list[ScheduledFault]:
        """Scheduled faults that did not fire: pending, then failed (what shrinking drops)."""
        return self.scheduler.unfired()

    # -- waits and states (``harness.sim.waits``) -----------------------------------------

    def first_healthy_time(self) -> float | None:
        """Monotonic time the job first had a HEALTHY node (chaos times faults from it)."""
        return waits.first_healthy_time(self.timeline)

    def in_state(self, state: WorkerState, node: int | None = None) -> bool:
        """Is ``node`` (default: every running node) in ``state`` now (HEALTHY: with live workers)?"""
        return waits.in_state(self, state, node)

    def wait_for_state(self, state: WorkerState, timeout: float = 30, node: int | None = None) -> None:
        """Block until ``node`` (default: every running node) is in ``state``."""
        waits.wait_for_state(self, state, timeout, node)

    def wait_for_recovery(self, timeout: float = 30) -> float:
        """Block until the job recovered from the last fault; its recovery latency in seconds."""
        return waits.wait_for_recovery(self, timeout)

    def wait(self, timeout: float = 120, allow_unfired: bool = False) -> JobResult:
        """Wait for every node agent to finish (frozen nodes excepted: close() kills them);
        the merged result. ``FaultError``, ``JobHung`` as soon as a fault failed or a node
        hung; ``FaultNotFired`` if faults of the caller's (not chaos's) never fired, unless
        ``allow_unfired`` (``harness.sim.waits``)."""
        return waits.wait_for_end(self, timeout, allow_unfired)

    # -- the result, the verdicts, the end -------------------------------------------------

    def finished(self) -> bool:
        """Every node agent ended on its own."""
        return bool(self.nodes) and all(not n.alive() for n in self.nodes.values())

    def result(self) -> JobResult:
        """The nodes' results merged (``harness.sim.truth.job_result``)."""
        return merge_results(self.nodes)

    def goodput(self) -> Goodput:
        """How much of the job's wall time was training; the rest by category."""
        return self.timeline.goodput()

    def compare_golden(self, rtol: float | None = None, timeout: float = 120,
                       cache_dir: str | None = None) -> GoldenDiff:
        """Compare this (finished) job with its fault-free twin, run or reused from ``cache_dir``
        (``rtol``: default the cluster's ``golden_rtol``, 0: bitwise): ``harness.sim.truth.verdicts``."""
        return verdicts.compare_golden(self, rtol, timeout, cache_dir)

    def invariant_problems(self, finished: bool | None = None) -> list[str]:
        """The invariants this job broke so far (see harness.sim.truth.invariants)."""
        return verdicts.invariant_problems(self, self.finished() if finished is None else finished)

    def check_invariants(self) -> None:
        """Raise ``InvariantViolation`` (with the timeline) if any invariant is broken."""
        if problems := self.invariant_problems():
            raise InvariantViolation(problems, self.timeline)

    def terminate(self) -> list[str]:
        """SIGKILL whatever is still running, then close what the job owns, each after every
        process that could be inside it; descriptions of what would not die."""
        self.scheduler.stop()
        killed, alive = kill_all(self.nodes, self.timeline, self.ledger)
        self.killed_nodes |= killed
        self.close_warnings += self.storage.close()  # what is unhealed: given once the cluster closed
        self.bus.close()
        self.harness_events.close()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.net is not None:  # a live process pins a namespace
            self.net.close()
        leftovers = self.resources.close() + self.place.close()  # the place's own last (on hosts: connections)
        return survivors(alive) + leftovers

    def __repr__(self) -> str:
        return f"Job(run_id={self.run_id}, nodes={ {i: n.name for i, n in self.nodes.items()} })"
