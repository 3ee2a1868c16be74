"""A running simulated job: its node agents, its timeline, the faults you can inject.

``Cluster.launch`` creates one; the nodes are real agent processes
(``python -m harness.sim.node_main``) whose events feed the job's ``Timeline`` through
its ``EventBus`` (``harness.sim.bus``); every wait here sleeps on that bus.

A node is named by its integer index everywhere; its generated name is a display label
(``timeline.label(i)``). The harness records what it does to nodes: ``node_start`` (index,
label, agent pid) when it starts one, ``node_exit`` (exit code, or the signal, from its
own ``waitpid``) when an agent ends, and for a node it killed, froze or removed a terminal
``state`` entry on the node's own timeline (``"source": "harness"``, with the ``cause``),
so ``timeline.states(i)`` of a killed node ends in ``FAILED`` (``harness.sim.node_ledger``).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.agent import RunResult, WorkerState
from harness.errors import ERROR_FILE_ENV, ConfigError, ElasticError, ProcessFailure
from harness.events import EVENTS_ENV, NODE_ENV, WAKE_ENV, EventWriter
from harness.procs import STACKS_ENV, WORKER_NICE_ENV, is_same_process, signal_process_group
from harness.rendezvous import MAX_LEASE_FACTOR
from harness.sim.bus import EventBus
from harness.sim.faults import (
    ORDERS_ENV,
    AtStep,
    Fault,
    Immediately,
    JobShape,
    NodeAdd,
    ScheduledFault,
    Trigger,
    WorkerKill,
    check_targets,
)
from harness.sim.hangs import GRACE_S, Hang, JobHung, describe_workers, find_hang, teardown_hint
from harness.sim.invariants import InvariantViolation, JobFacts, check_timeline
from harness.sim.net import NODE_INTERFACE, Network
from harness.sim.network_faults import NetworkFaults
from harness.sim.node_ledger import NodeLedger
from harness.sim.node_main import WORKER_TMPDIR_ENV
from harness.sim.node_process import NodeProcess
from harness.sim.node_process import start_node as start_agent_process
from harness.sim.process_faults import ProcessFaults
from harness.sim.progress import DIGEST_ENV
from harness.sim.resources import ResourceFaults
from harness.sim.scheduler import FaultError, FaultNotFired, FaultScheduler
from harness.sim.storage.faults import StorageFaults
from harness.sim.timeline import HARNESS, Timeline

if TYPE_CHECKING:

    from harness.sim.cluster import Cluster
    from harness.sim.fault_target import LastingFaults
    from harness.sim.golden import GoldenDiff
    from harness.sim.rendezvous_store import StoreHandle
    from harness.sim.training import Goodput

__all__ = ["Job", "JobResult", "NodeProcess", "FaultError", "fifos_under"]

SHARED_DIR_ENV = "HARNESS_SHARED_DIR"  # the job's shared dir, as workers see it
NODE_DISK_ENV = "HARNESS_NODE_DISK"  # the node's local disk, as its workers see it
#: how much lower the workers' CPU priority is than their agent's (``harness.procs``)
WORKER_NICE = 10



# -- result -------------------------------------------------------------------------------


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


# -- nodes --------------------------------------------------------------------------------


class Job:
    """A running job: its nodes, its timeline, its waits and its end. Its faults live in
    parts that act on it as a ``FaultTarget`` (``harness.sim.fault_target``):
    ``job.processes`` (signals to workers, agents, nodes, the store's host) and
    ``job.network`` (cut, thinned and healed links); the short methods below
    (``kill_worker``, ``partition``...) hand each call to its part, and ``heal`` ends the
    lasting faults of every part in ``lasting``."""

    def __init__(self, cluster: Cluster, entrypoint: Callable[..., Any] | str, args: list[Any],
                 module: bool):
        self.cluster: Cluster = cluster
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
        #: where the workers dump their Python stacks on SIGUSR1 (``harness.sim.stacks``):
        #: the pytest session's directory, else the job's own
        self.stacks_dir = os.environ.get(STACKS_ENV) or os.path.join(self.directory, "stacks")
        os.makedirs(self.stacks_dir, exist_ok=True)
        #: the job's filesystem (a FUSE mount the harness serves, where it can) and its
        #: storage faults (``harness.sim.storage.faults``)
        self.storage = StorageFaults(self)
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
        #: the rendezvous store the harness runs for the job (None: one node hosts its own)
        self.store: StoreHandle | None = None
        #: the nodes' network (built with the first node: the store lives in it too)
        self.net: Network = None  # type: ignore[assignment]
        self._scheduler: FaultScheduler | None = None
        self._joins_scheduled = 0  # node joins scheduled: each makes one more node index valid
        #: the job's faults, one part per kind of thing they break (each acts on the job as
        #: a ``FaultTarget``); ``lasting`` holds each part whose faults ``heal`` ends
        self.processes = ProcessFaults(self)
        self.network = NetworkFaults(self)
        self.lasting: list[LastingFaults] = [self.network]
        self.chaos_schedule: list[ScheduledFault] = []
        self.killed_nodes: set[int] = set()  # nodes whose agents terminate() had to SIGKILL
        #: the nodes' cgroups and the faults written to them (slow_node, memory_limit)
        self.resources = ResourceFaults(self)
        self.lasting += [self.resources, self.storage]

    # -- nodes ---------------------------------------------------------------------------

    def _rendezvous_settings(self) -> dict[str, Any]:
        cluster = self.cluster
        if self._rdzv is None:
            if cluster.max_nodes == 1 and cluster.rdzv_backend not in ("etcd", "etcd-v2"):
                self._rdzv = {"backend": "c10d", "endpoint": "localhost:0", "configs": {}}
            else:
                from harness.sim import rendezvous_store

                self._rdzv, self.store = rendezvous_store.rendezvous_for(cluster, self)
        return self._rdzv

    def _command(self, index: int) -> tuple[Callable[..., Any] | str, list[Any]]:
        if callable(self.entrypoint):
            return self.entrypoint, [self._expand(a, index) for a in self.args]
        head = ["-u", "-m"] if self.module else ["-u"]
        return sys.executable, [*head, self.entrypoint, *(self._expand(str(a), index) for a in self.args)]

    def _expand(self, arg: Any, index: int) -> Any:
        """``{shared}`` and ``{node_disk}`` in a launch arg: this job's dirs (node ``index``'s disk)."""
        if not isinstance(arg, str):
            return arg
        return arg.replace("{shared}", self.shared_dir).replace("{node_disk}", self._disk_of(index))

    def _disk_of(self, index: int) -> str:
        return str(self.storage.disk_of(index))

    def node_disk(self, node: int) -> str:
        """Node ``node``'s local disk: ``{node_disk}`` in its args, ``HARNESS_NODE_DISK`` in its workers."""
        self.node(node)  # an unknown node raises, naming the valid ones
        return self._disk_of(node)

    def start_node(self) -> int:
        """Start one more node agent (``launch``'s nodes, and ``add_node``'s); its index."""
        from harness.launch import LaunchConfig
        from harness.sim.node_main import NodeSpec

        cluster = self.cluster
        index = len(self.nodes)
        name = cluster._names.next(index)
        if self.net is None:  # every node slot's host at once: joins find theirs ready
            self.net = Network(cluster.max_nodes, mode=cluster.network)
        while self.net.nnodes <= index:  # an extra node, past max_nodes
            self.net.add_node()
        addr = self.net.address(index)
        directory = os.path.join(self.directory, f"node{index}")
        os.makedirs(os.path.join(directory, "tmp"))
        self.storage.add_node(index)
        self.storage.ready()  # workers must find the filesystem served
        rdzv = self._rendezvous_settings()
        entrypoint, args = self._command(index)
        config = LaunchConfig(
            min_nodes=cluster.min_nodes, max_nodes=cluster.max_nodes,
            nproc_per_node=cluster.nproc_per_node, run_id=self.run_id, role="default",
            rdzv_endpoint=rdzv["endpoint"], rdzv_backend=rdzv["backend"],
            # the harness knows how many nodes it starts: no 30 s first-round last call
            # waiting for stragglers that will never come (a rdzv_conf of the user's wins)
            rdzv_configs={"last_call_timeout": 1.0, **rdzv["configs"],
                          **(rdzv.get("host_configs", {}) if index == 0 else {}),
                          **cluster.rdzv_conf}, max_restarts=cluster.max_restarts,
            monitor_interval=cluster.monitor_interval, start_method=cluster.start_method,
            local_addr=addr, shutdown_timeout=cluster.shutdown_timeout,
            exit_barrier_timeout=cluster.exit_barrier_timeout, node_name=name,
        )
        spec = NodeSpec(config=config, entrypoint=entrypoint, args=args,
                        result_path=os.path.join(directory, "result.pkl"))
        spec_path = os.path.join(directory, "spec.pkl")
        with open(spec_path, "wb") as fp:
            pickle.dump(spec, fp)
        env = {**os.environ, **cluster.env, EVENTS_ENV: self.events_path, NODE_ENV: str(index),
               WAKE_ENV: self.bus.wake_path, ORDERS_ENV: self.orders_dir,
               "TMPDIR": os.path.join(directory, "tmp"), SHARED_DIR_ENV: self.shared_dir,
               NODE_DISK_ENV: self._disk_of(index), WORKER_TMPDIR_ENV: self.storage.tmp_of(index),
               **self.resources.node_env(index)}
        if cluster.golden:
            env[DIGEST_ENV] = "1"  # final-state digests for the twin comparison
        env.pop(ERROR_FILE_ENV, None)
        slot = self._free_slot()
        gpus = cluster.gpus_for(slot)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        if cluster.nproc_per_node > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        # the agent runs before its own workers (its keep-alive must not starve behind their
        # imports or a slow_node quota: a live node taken for dead); a user's value wins
        env.setdefault(WORKER_NICE_ENV, str(WORKER_NICE))
        env[STACKS_ENV] = self.stacks_dir  # a hang is named with its workers' stacks
        if cluster.start_method == "zygote":
            env.update(cluster.zygote_env())
        if self.net.mode == "netns":
            env.setdefault("GLOO_SOCKET_IFNAME", NODE_INTERFACE)  # not whatever the hostname says
        netns = self.net.namespace_path(index)
        with open(os.path.join(directory, "agent.log"), "wb") as log:
            popen = start_agent_process(cluster.pool.node_server(), spec_path, netns, env, log)
        self.nodes[index] = NodeProcess(index, name, addr, directory, popen, spec.result_path, slot, gpus)
        self.harness_events.emit("node_start", target_node=index, label=name, pid=popen.pid,
                                 addr=addr, slot=slot)
        self.ledger.watch(index)
        return index

    def _free_slot(self) -> int:
        """The lowest node slot (GPU slice) no live node of this job holds."""
        held = {n.slot for n in self.nodes.values() if n.alive()}
        free = [s for s in range(self.cluster.max_nodes) if s not in held]
        return free[0] if free else len(self.nodes) % self.cluster.max_nodes

    def node_name(self, node: int) -> str:
        """Node ``node``'s display label (the same as ``timeline.label(node)``)."""
        return self.node(node).name

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """The ``CUDA_VISIBLE_DEVICES`` ids node ``node`` was given (empty without GPUs)."""
        return self.node(node).gpus

    def node(self, node: int) -> NodeProcess:
        """Node ``node``'s handle; ``ConfigError`` naming the valid nodes if it has none."""
        try:
            return self.nodes[node]
        except (KeyError, TypeError):
            raise ConfigError("node", node, f"is not one of this job's nodes {sorted(self.nodes)}") from None

    def agent_log(self, node: int) -> str:
        try:
            with open(os.path.join(self.node(node).directory, "agent.log"), errors="replace") as fp:
                return fp.read()
        except FileNotFoundError:
            return ""

    # -- observing -----------------------------------------------------------------------

    def worker_starts(self, node: int) -> dict[int, dict[str, Any]]:
        """local_rank -> the latest ``worker_start`` event of each of the node's workers."""
        self.node(node)
        starts = self.timeline.events("worker_start", node)
        latest: dict[int, dict[str, Any]] = {}
        for start in starts:  # time-ordered: the last start of each local rank wins
            latest[start["local_rank"]] = start
        return latest

    def worker_pids(self, node: int) -> dict[int, int]:
        """local_rank -> pid of the node's current workers (alive, same process as started)."""
        return {rank: s["worker_pid"] for rank, s in self.worker_starts(node).items()
                if is_same_process(s["worker_pid"], s.get("start_time"))}

    def _latest_state(self, node: int) -> WorkerState | None:
        self.node(node)
        states = self.timeline.states(node)
        return states[-1] if states else None

    def first_healthy_time(self) -> float | None:
        """Monotonic time the job first had a HEALTHY node (chaos times faults from it)."""
        for event in self.timeline.events("state"):
            if event["state"] == WorkerState.HEALTHY.value:
                mono: float = event["mono"]
                return mono
        return None

    def in_state(self, state: WorkerState, node: int | None = None) -> bool:
        """Is ``node`` (default: every running node) in ``state`` now (with live workers
        when the state is HEALTHY)?"""
        targets = [node] if node is not None else [i for i, n in self.nodes.items() if n.alive()]
        if not targets or not all(self._latest_state(i) == state for i in targets):
            return False
        return state != WorkerState.HEALTHY or all(self.worker_pids(i) for i in targets)

    def _wait(self, predicate: Callable[[], bool], timeout: float, lifecycle: bool = False) -> bool:
        """Sleep on the event bus until ``predicate()`` or a fault failure (raised).
        ``lifecycle``: the predicate depends on agent exits only (wake on nothing else)."""
        done = self.bus.wait_until(lambda: bool(self.failed_faults()) or predicate(), timeout, lifecycle)
        self._raise_fault_failures()
        return done

    def _raise_fault_failures(self) -> None:
        failures = self.failed_faults()
        if failures:
            reasons = "; ".join(f"{entry.describe()}: {reason}" for entry, reason in failures)
            raise FaultError(f"{len(failures)} scheduled fault(s) could not be applied: {reasons}")

    def wait_for_state(self, state: WorkerState, timeout: float = 30, node: int | None = None) -> None:
        """Block until ``node`` (default: every running node) is in ``state``."""
        if node is not None:
            self.node(node)
        if not self._wait(lambda: self.in_state(state, node), timeout):
            current = {i: getattr(self._latest_state(i), "value", None) for i in self.nodes}
            raise TimeoutError(f"nodes did not reach {state.value} within {timeout:g}s "
                               f"(now {current})\n{self.timeline.format()}")

    def wait_for_recovery(self, timeout: float = 30) -> float:
        """Block until the job recovered from the last fault (every disturbed node
        HEALTHY again, or finished); returns the recovery latency in seconds."""
        deadline = time.monotonic() + timeout
        if not self._wait(lambda: not self.pending_faults(), timeout):  # scheduled faults fire first
            raise TimeoutError(f"scheduled faults never fired within {timeout:g}s: "
                               f"{[e.describe() for e in self.pending_faults()]}")
        if not self.timeline.faults():
            raise ElasticError("no fault has been injected into this job")

        def recovered() -> bool:
            return self.timeline.faults()[-1].recovery_latency is not None

        if not self._wait(recovered, max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"no recovery from {self.timeline.faults()[-1]['fault']} within "
                               f"{timeout:g}s\n{self.timeline.format()}")
        latency = self.timeline.faults()[-1].recovery_latency
        assert latency is not None
        return latency

    # -- faults: one-line hand-offs to the parts ------------------------------------------

    def slow_node(self, node: int, cpu: float = 0.2) -> None:
        """Node ``node`` gets ``cpu`` CPUs' worth of time (a straggler) until ``heal``."""
        self.resources.slow_node(node, cpu)

    def memory_limit(self, node: int, limit: str | int = "300M") -> None:
        """Node ``node``'s processes share ``limit`` bytes (then OOM kills) until ``heal``."""
        self.resources.memory_limit(node, limit)

    def kill_worker(self, node: int, local_rank: int, sig: int = signal.SIGKILL) -> None:
        """The worker dies of ``sig``; its agent must notice and restart the group."""
        self.processes.kill_worker(node, local_rank, sig)

    def hang_worker(self, node: int, local_rank: int) -> None:
        """SIGSTOP: the worker is stuck, not dead."""
        self.processes.hang_worker(node, local_rank)

    def kill_agent(self, node: int) -> None:
        """The agent dies (SIGKILL); its workers must follow on their own (returns once reaped)."""
        self.processes.kill_agent(node)

    def kill_node(self, node: int, lose_unsynced: bool = False, torn: bool = False) -> None:
        """Agent and workers SIGKILLed at once: a machine lost (returns once reaped);
        ``lose_unsynced``: what it wrote and never fsynced is gone (``torn``: but a prefix)."""
        self.processes.kill_node(node, lose_unsynced, torn)

    def remove_node(self, node: int) -> None:
        """Graceful leave: SIGTERM to the agent."""
        self.processes.remove_node(node)

    def freeze_node(self, node: int) -> None:
        """SIGSTOP the whole node: alive to TCP, silent to heartbeats."""
        self.processes.freeze_node(node)

    def add_node(self) -> int:
        """A new node joins (scale up); its index."""
        return self.processes.add_node()

    def join_node(self) -> int:
        """Deprecated spelling of ``add_node``."""
        from harness.sim.schema import deprecated

        deprecated("Job.join_node", "Job.add_node", "method")
        return self.add_node()

    def kill_store_host(self) -> None:
        """The process hosting the rendezvous store dies."""
        self.processes.kill_store_host()

    def node_address(self, node: int) -> str:
        """Node ``node``'s IP address (inside 198.18.0.0/15 with ``network="netns"``)."""
        return self.network.address(node)

    def partition(self, node: int, peers: str | Sequence[int] = "all", direction: str = "both") -> None:
        """Silently drop node ``node``'s packets to and from ``peers`` ("all", "store" or
        nodes); ``direction`` "in" or "out" cuts one way only."""
        self.network.partition(node, peers, direction)

    def packet_loss(self, node: int, probability: float) -> None:
        """Drop each of node ``node``'s packets with ``probability`` (0..1), both ways."""
        self.network.packet_loss(node, probability)

    def bandwidth(self, node: int, rate: str | int) -> None:
        """Limit node ``node``'s link to ``rate`` (e.g. "1mbit", or bits per second)."""
        self.network.bandwidth(node, rate)

    def link_down(self, node: int) -> None:
        """Unplug node ``node``'s cable (until ``heal``)."""
        self.network.link_down(node)

    def heal(self, node: int | None = None) -> None:
        """End node ``node``'s lasting faults (every node's with None): those of each part
        in ``lasting`` (the network's: partitions, loss, bandwidth, link down; the
        resources': slow_node, memory_limit; the storage's: the node's disk, or with None
        every disk and the shared filesystem). One ``heal`` event names what ended, with
        each part's detail (``storage``: per disk). A part that cannot heal here (the
        network in loopback mode) raises only when nothing else was healed."""
        if node is not None:
            self.node(node)
        healed: list[str] = []
        detail: dict[str, Any] = {}
        refused: list[ConfigError] = []
        for part in self.lasting:
            try:
                ended = part.end_lasting(node)
            except ConfigError as e:  # the network part in loopback mode: no network to heal
                refused.append(e)
                continue
            healed += ended.names
            detail.update(ended.detail)
        if refused and not healed:
            raise refused[0]
        self.record("heal", **({"target_node": node} if node is not None else {}), healed=sorted(healed),
                    **detail)

    # -- what a fault needs (``FaultTarget``) -------------------------------------------------

    def record(self, event: str, **fields: Any) -> None:
        """Write the event of something the harness does to the job (a ``fault``, a
        ``heal``); a scheduled action fires atomically with the write."""
        if self._scheduler is None:
            self.harness_events.emit(event, **fields)
            return
        with self._scheduler.recording():
            self.harness_events.emit(event, **fields)

    # -- scheduled faults -----------------------------------------------------------------

    # storage faults (``job.storage``: harness.sim.storage.faults)

    def disk_full(self, node: int | None = None) -> None:
        """Writes and fsyncs on node ``node``'s disk (None: the shared filesystem) fail with ENOSPC."""
        self.storage.disk_full(node)

    def slow_io(self, node: int | None = None, delay: float = 0.2) -> None:
        """Every write and fsync on node ``node``'s disk (None: shared) takes ``delay`` s longer."""
        self.storage.slow_io(node, delay)

    def io_error(self, node: int | None = None, errno: int = 5, path: str = "*", probability: float = 1.0) -> None:
        """I/O on files matching ``path`` on node ``node``'s disk (None: shared) fails with ``errno``."""
        self.storage.io_error(node, errno, path, probability)

    def inject(self, fault: Fault, trigger: Trigger | None = None) -> None:
        """Schedule ``fault`` to fire when ``trigger`` (default: now) is met."""
        self.schedule([ScheduledFault(fault, trigger or Immediately())])

    def schedule(self, entries: list[ScheduledFault]) -> None:
        """Arm a list of scheduled faults; a background thread fires each when due. One that
        names a node, local rank or rank this job can never have raises ``ConfigError`` here
        (none of the list is armed then); one that cannot be applied makes the job's waits
        (``wait``...) raise ``FaultError``, and one still pending when the job ends makes
        ``wait`` raise ``FaultNotFired``."""
        joins = self._joins_scheduled
        for entry in entries:
            joins += isinstance(entry.fault, NodeAdd)
            check_targets(entry, self._shape(joins))
        self._joins_scheduled = joins
        for entry in entries:
            crash = entry.fault
            if isinstance(crash, WorkerKill) and crash.exit_code is not None and isinstance(entry.trigger, AtStep):
                # exact (rank, step) crashes are left as orders the worker obeys itself
                self.processes.order_exit_at(entry.trigger.rank, entry.trigger.step, crash.exit_code,
                                             entry.describe())
                continue
            if self._scheduler is None:
                self._scheduler = FaultScheduler(self)
            self._scheduler.add(entry)

    def _shape(self, joins: int) -> JobShape:
        cluster = self.cluster
        nnodes = f"{cluster.min_nodes}:{cluster.max_nodes}"
        return JobShape(nodes=max(cluster.max_nodes, len(self.nodes)) + joins,
                        nproc_per_node=cluster.nproc_per_node,
                        world=cluster.max_nodes * cluster.nproc_per_node, nnodes=nnodes)

    def never_fired(self) -> list[tuple[str, str]]:
        """(fault, why) of every fault of the caller's own still not fired: scheduled ones
        pending (chaos faults excepted: they may not fire), and exit-code orders no worker
        obeyed (no ``report_step`` at that step)."""
        chaos = {id(e) for e in self.chaos_schedule}
        pending = self._scheduler.never_fired() if self._scheduler else []
        reasons = [(entry.describe(), why) for entry, why in pending if id(entry) not in chaos]
        reasons += self.processes.unobeyed()
        return reasons

    def pending_faults(self) -> list[ScheduledFault]:
        """Scheduled faults armed (or waiting for their predecessor), not fired yet."""
        return self._scheduler.pending() if self._scheduler else []

    def failed_faults(self) -> list[tuple[ScheduledFault, str]]:
        """(entry, reason) of the scheduled faults that could not be applied (never fired)."""
        return self._scheduler.failures() if self._scheduler else []

    def unfired_faults(self) -> list[ScheduledFault]:
        """Every scheduled fault that did not fire: pending, then failed before firing
        (what the chaos report lists as not fired, and shrinking drops)."""
        return self._scheduler.unfired() if self._scheduler else []

    # -- training truth --------------------------------------------------------------------

    def goodput(self) -> Goodput:
        """How much of the job's wall time was training; the rest by category."""
        return self.timeline.goodput()

    def compare_golden(self, rtol: float | None = None, timeout: float = 120,
                       cache_dir: str | None = None) -> GoldenDiff:
        """Compare this (finished) job with its fault-free twin: the same script, args and
        cluster shape, no faults, no chaos (``harness.sim.twin``; reused from ``cache_dir``, or
        the cluster's ``golden_cache``, when it holds it). ``rtol``: default the cluster's
        ``golden_rtol`` (0: bitwise). Final digests compare when the cluster was made with
        ``golden=True`` (the workers then digest their final state). The verdict goes on the
        timeline as a ``golden`` event, with the twin's losses and both runs' digests: the job
        page draws the comparison from it (``harness.sim.golden.event_fields``)."""
        from harness.sim.golden import compare, event_fields
        from harness.sim.twin import job_record, twin_record

        if not self.finished():
            raise ElasticError(f"job {self.run_id} is still running: wait() for it before compare_golden()")
        cache = cache_dir if cache_dir is not None else self.cluster.golden_cache
        twin, cached = twin_record(self, timeout, cache)
        run = job_record(self)
        diff = compare(run, twin, self.cluster.golden_rtol if rtol is None else rtol)
        self.harness_events.emit("golden", cached=cached, **event_fields(diff, run, twin))
        return diff

    # -- the end -------------------------------------------------------------------------

    def _running(self) -> list[int]:
        # a snapshot: the fault thread may add a node (join) while we wait
        return [i for i, n in list(self.nodes.items()) if i not in self.ledger.frozen and n.alive()]

    def wait(self, timeout: float = 120, allow_unfired: bool = False) -> JobResult:
        """Wait for every node agent to finish (nodes the harness froze excepted: they
        never will; close() kills them); the merged result. Raises ``FaultError`` as soon
        as a scheduled fault could not be applied, and ``FaultNotFired`` (saying why for
        each) if the job ended with faults of the caller's still not fired, unless
        ``allow_unfired`` (chaos faults never count: ``unfired_faults()`` lists them)."""
        hangs: list[Hang] = []

        def over() -> bool:
            running = self._running()
            hang = find_hang(self.timeline, running, time.monotonic(),
                             self.cluster.exit_barrier_timeout + GRACE_S,
                             {n: self.worker_pids(n).values() for n in running}) if running else None
            if hang is not None:
                hangs.append(hang)
            return not running or hang is not None

        if not self._wait(over, timeout, lifecycle=True):
            running = self._running()
            raise TimeoutError(f"job {self.run_id} did not finish within {timeout:g}s; nodes "
                               f"{running} still running\n{self.timeline.format()}")
        if hangs:
            raise JobHung(self._hang_report(hangs[0]))
        if not allow_unfired:
            unfired = self.never_fired()
            if unfired:
                raise FaultNotFired(unfired)
        return self.result()

    def _hang_report(self, hang: Hang) -> str:
        """``JobHung``'s message: the hung node, what its workers last did, their stacks."""
        import psutil

        from harness.sim.stacks import job_workers, worker_stacks

        alive = self.worker_pids(hang.node)
        status = {}
        for pid in alive.values():
            try:
                status[pid] = psutil.Process(pid).status()
            except psutil.Error:
                pass
        lines, finished = describe_workers(self.timeline, hang.node, alive, status)
        t0 = self.timeline.events()[0]["mono"] if self.timeline.events() else hang.finished_at
        what = ("Its workers finished training and did not exit (their stacks say where: "
                "torch's process-group teardown, or the script's own end)" if finished else
                "Its workers stopped short of the steps their peers completed (a collective "
                "whose peers are gone, or the script's own wait)" if alive else
                "It has no live worker: its agent did not end (its log: agent.log)")
        head = (f"job {self.run_id} hung: node {hang.node} ({self.node_name(hang.node)}) is still "
                f"running {hang.waited:.1f}s after {hang.finished} succeeded (round "
                f"{hang.finished_round}, at {hang.finished_at - t0:.1f}s); the exit barrier "
                f"gives a slower node {self.cluster.exit_barrier_timeout:g}s. {what}.")
        stacks = worker_stacks(job_workers(self, nodes=[hang.node]), self.stacks_dir)
        hint = teardown_hint(stacks) if finished else None
        return "\n".join([head, *(f"  {line}" for line in lines), *([f"  Where: {hint}."] if hint else []),
                          "stacks:", stacks, "timeline:", self.timeline.format()])

    def finished(self) -> bool:
        """Every node agent ended on its own."""
        return bool(self.nodes) and all(not n.alive() for n in self.nodes.values())

    def invariant_problems(self, finished: bool | None = None) -> list[str]:
        """The invariants this job broke so far (see harness.sim.invariants)."""
        done = self.finished() if finished is None else finished
        facts = JobFacts(max_restarts=self.cluster.max_restarts,
                         nproc_per_node=self.cluster.nproc_per_node, finished=done,
                         succeeded=(self.result().state == WorkerState.SUCCEEDED) if done else None,
                         fence_bound=self._fence_bound())
        return check_timeline(self.timeline, facts)

    def _fence_bound(self) -> float:
        """How long a node cut off from the store may keep its workers: the longest its
        lease may grow to (``rdzv_conf``'s ``max_lease``, else 5 x its heartbeat timeout,
        c10d's 0.8 s by default: a loaded host's), the workers' stop grace, and 3 s of
        slack for a loaded machine (the invariant is about fencing, not about speed)."""
        heartbeat = float(self.cluster.rdzv_conf.get("heartbeat_timeout", 0.8))
        lease = float(self.cluster.rdzv_conf.get("max_lease", MAX_LEASE_FACTOR * heartbeat))
        return lease + self.cluster.shutdown_timeout + 3.0

    def check_invariants(self) -> None:
        """Raise ``InvariantViolation`` (with the timeline) if any invariant is broken."""
        problems = self.invariant_problems()
        if problems:
            raise InvariantViolation(problems, self.timeline)

    def result(self) -> JobResult:
        run_results = {i: r for i, n in self.nodes.items() if (r := n.result()) is not None}
        exit_codes = {i: n.popen.poll() for i, n in self.nodes.items()}
        failed = any(r.is_failed() for r in run_results.values())
        succeeded = any(r.state == WorkerState.SUCCEEDED for r in run_results.values())
        state = WorkerState.SUCCEEDED if succeeded and not failed else WorkerState.FAILED
        values: dict[int, Any] = {}
        failures: dict[int, ProcessFailure] = {}
        for result in run_results.values():
            values.update(result.return_values)
            failures.update(result.failures)
        return JobResult(state, run_results, values, failures, exit_codes)

    def terminate(self) -> list[str]:
        """SIGKILL whatever is still running; returns descriptions of what would not die."""
        import psutil

        if self._scheduler is not None:
            self._scheduler.stop()
        victims: list[psutil.Process] = []
        for index, node in self.nodes.items():
            for start in self.timeline.events("worker_start", index):
                pid = start["worker_pid"]
                if is_same_process(pid, start.get("start_time")):  # never a reused pid
                    signal_process_group(pid, signal.SIGKILL)
                    _add_process(victims, pid)
            if node.alive():
                self.killed_nodes.add(index)
                self.ledger.harm(index, "close")
                signal_process_group(node.pid, signal.SIGCONT)
                signal_process_group(node.pid, signal.SIGKILL)
            node.popen.wait()
            self.ledger.record_exit(index)
        _, alive = psutil.wait_procs(victims, timeout=5)
        self.storage.close()  # after every process that could be inside it; reports what is unhealed
        self.bus.close()
        self.harness_events.close()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.net is not None:  # after every process in it: a live one pins a namespace
            self.net.close()
        leftovers = self.resources.close()  # after every process in them, too
        return [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE] + leftovers

    def __repr__(self) -> str:
        return f"Job(run_id={self.run_id}, nodes={ {i: n.name for i, n in self.nodes.items()} })"


def fifos_under(directory: str) -> list[str]:
    import stat

    found = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                continue
    return found


def _add_process(into: list[Any], pid: int) -> None:
    import psutil

    try:
        into.append(psutil.Process(pid))
    except psutil.NoSuchProcess:
        pass

