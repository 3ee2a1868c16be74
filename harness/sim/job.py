"""A running simulated job: its node agents, its timeline, the faults you can inject.

``Cluster.launch`` creates one; the nodes are real agent processes
(``python -m harness.sim.node_main``) whose events feed the job's ``Timeline`` through
its ``EventBus`` (``harness.sim.bus``); every wait here sleeps on that bus.

A node is named by its integer index everywhere; its generated name is a display label
(``timeline.label(i)``). The harness records what it does to nodes: ``node_start`` (index,
label, agent pid) when it starts one, ``node_exit`` (exit code, or the signal, from its
own ``waitpid``) when an agent ends, and for a node it killed, froze or removed a terminal
``state`` entry on the node's own timeline (``"source": "harness"``, with the ``cause``),
so ``timeline.states(i)`` of a killed node ends in ``FAILED``.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.agent import RunResult, WorkerState
from harness.errors import ConfigError, ElasticError, ProcessFailure
from harness.events import EVENTS_ENV, NODE_ENV, WAKE_ENV, EventWriter
from harness.procs import is_same_process, signal_process_group
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
    write_exit_order,
)
from harness.sim.invariants import InvariantViolation, JobFacts, check_timeline
from harness.sim.job_network import NetworkFaults
from harness.sim.job_process import ProcessFaults
from harness.sim.net import NODE_INTERFACE, Network
from harness.sim.node_main import WORKER_TMPDIR_ENV
from harness.sim.node_process import NodeProcess, start_node
from harness.sim.progress import DIGEST_ENV
from harness.sim.scheduler import FaultError, FaultNotFired, FaultScheduler, TargetNotReady
from harness.sim.storage.faults import StorageFaults
from harness.sim.timeline import HARNESS, Timeline

if TYPE_CHECKING:

    from harness.sim.cluster import Cluster
    from harness.sim.golden import GoldenDiff
    from harness.sim.training import Goodput

__all__ = ["Job", "JobResult", "NodeProcess", "FaultError", "fifos_under"]

SHARED_DIR_ENV = "HARNESS_SHARED_DIR"  # the job's shared dir, as workers see it
NODE_DISK_ENV = "HARNESS_NODE_DISK"  # the node's local disk, as its workers see it

#: agent states after which the harness adds no terminal entry of its own
_FINAL = (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.UNKNOWN)


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


class Job(ProcessFaults, NetworkFaults):
    """A running job: its nodes, its timeline, its waits and its end; the faults you can
    inject come from ``ProcessFaults`` (signals to agents and workers) and
    ``NetworkFaults`` (cut, thinned and healed links)."""

    #: seconds a kill (``kill_node``, ``kill_agent``...) waits for the killed agent to be
    #: reaped before it raises ``FaultError``; also bounds the wait for a SIGSTOP to land
    reap_timeout: float = 10.0

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
        #: the job's filesystem (a FUSE mount the harness serves, where it can) and its
        #: storage faults (``harness.sim.storage.faults``)
        self.storage = StorageFaults(self)
        #: the job's own shared filesystem (checkpoints): ``{shared}`` in the args, and
        #: ``HARNESS_SHARED_DIR`` in every worker; fresh for every job (a twin gets its own)
        self.shared_dir = self.storage.shared_dir
        self.launched_nodes = 0  # nodes ``launch`` started (the twin starts as many)
        self._harness_events = EventWriter(self.events_path, HARNESS, self.run_id, wake=self.bus.wake_path)
        self._exit_lock = threading.Lock()
        self._exits: dict[int, int] = {}  # node -> its agent's return code, once recorded
        self._harmed: dict[int, str] = {}  # node -> what the harness did to it (a fault kind)
        self._terminal: set[int] = set()  # nodes whose terminal entry the harness wrote
        self._rdzv: dict[str, Any] | None = None
        self._store: Any = None
        #: the nodes' network (built with the first node: the store lives in it too)
        self.network: Network = None  # type: ignore[assignment]
        self._scheduler: FaultScheduler | None = None
        self._joins_scheduled = 0  # node joins scheduled: each makes one more node index valid
        #: exit-code orders left for report_step: path -> (what was ordered, why it may not fire)
        self._orders: dict[str, tuple[str, str]] = {}
        self.chaos_schedule: list[ScheduledFault] = []
        self.killed_nodes: set[int] = set()  # nodes whose agents terminate() had to SIGKILL
        self.frozen_nodes: set[int] = set()  # nodes the harness SIGSTOPped (never finish)

    # -- nodes ---------------------------------------------------------------------------

    def _rendezvous_settings(self) -> dict[str, Any]:
        cluster = self.cluster
        if self._rdzv is None:
            if cluster.max_nodes == 1 and cluster.rdzv_backend not in ("etcd", "etcd-v2"):
                self._rdzv = {"backend": "c10d", "endpoint": "localhost:0", "configs": {}}
            else:
                from harness.sim import stores as _multinode

                self._rdzv, self._store = _multinode.rendezvous_for(cluster, self)
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
        self._node(node)  # an unknown node raises, naming the valid ones
        return self._disk_of(node)

    def _start_node(self) -> int:
        """Start one more node agent (``launch``'s nodes, and ``add_node``'s); its index."""
        from harness.launch import LaunchConfig
        from harness.sim.node_main import NodeSpec

        cluster = self.cluster
        index = len(self.nodes)
        name = cluster._names.next(index)
        if self.network is None:  # every node slot's host at once: joins find theirs ready
            self.network = Network(cluster.max_nodes, mode=cluster.network)
        while self.network.nnodes <= index:  # an extra node, past max_nodes
            self.network.add_node()
        addr = self.network.address(index)
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
               NODE_DISK_ENV: self._disk_of(index), WORKER_TMPDIR_ENV: self.storage.tmp_of(index)}
        if cluster.golden:
            env[DIGEST_ENV] = "1"  # final-state digests for the twin comparison
        env.pop("TORCHELASTIC_ERROR_FILE", None)
        slot = self._free_slot()
        gpus = cluster.gpus_for(slot)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        if cluster.nproc_per_node > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        if cluster.start_method == "zygote":
            env["HARNESS_ZYGOTE"] = cluster.zygote_path()
        if self.network.mode == "netns":
            env.setdefault("GLOO_SOCKET_IFNAME", NODE_INTERFACE)  # not whatever the hostname says
        netns = self.network.namespace_path(index)
        with open(os.path.join(directory, "agent.log"), "wb") as log:
            popen = start_node(cluster.pool.node_server(), spec_path, netns, env, log)
        self.nodes[index] = NodeProcess(index, name, addr, directory, popen, spec.result_path, slot, gpus)
        self._harness_events.emit("node_start", target_node=index, label=name, pid=popen.pid,
                                  addr=addr, slot=slot)
        self.bus.watch(popen.pid, functools.partial(_record_exit_of, weakref.ref(self), index))
        return index

    def _free_slot(self) -> int:
        """The lowest node slot (GPU slice) no live node of this job holds."""
        held = {n.slot for n in self.nodes.values() if n.alive()}
        free = [s for s in range(self.cluster.max_nodes) if s not in held]
        return free[0] if free else len(self.nodes) % self.cluster.max_nodes

    def node_name(self, node: int) -> str:
        """Node ``node``'s display label (the same as ``timeline.label(node)``)."""
        return self._node(node).name

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """The ``CUDA_VISIBLE_DEVICES`` ids node ``node`` was given (empty without GPUs)."""
        return self._node(node).gpus

    def _node(self, node: int) -> NodeProcess:
        try:
            return self.nodes[node]
        except (KeyError, TypeError):
            raise ConfigError("node", node, f"is not one of this job's nodes {sorted(self.nodes)}") from None

    def _live_node(self, node: int) -> NodeProcess:
        target = self._node(node)
        if not target.alive():
            raise TargetNotReady("node", node, f"has no running agent (it exited with {target.popen.poll()})")
        return target

    # -- what the harness does to nodes, recorded -----------------------------------------

    def _harm(self, node: int, cause: str) -> None:
        with self._exit_lock:
            self._harmed.setdefault(node, cause)

    def _record_exit(self, node: int) -> None:
        """Record the agent's exit (called on the bus's reader thread when its pidfd turns
        readable, and by ``terminate``): a ``node_exit`` event, and the terminal entry of a
        node the harness harmed. Once per node."""
        target = self.nodes[node]
        with self._exit_lock:
            if node in self._exits:
                return
            code = target.popen.poll()
            if code is None:
                try:  # exited (its pidfd said so) but reaped by a wait in another thread just now
                    code = target.popen.wait(1.0)
                except subprocess.TimeoutExpired:
                    code = None
            if code is not None:
                self._note_exit(node, code)
                return
        # dead but not reaped yet: a forked node's parent (the node fork server) may be
        # stopped or slow; record the exit when it reaps, never drop it
        later = getattr(target.popen, "when_exited", None)
        if later is not None:
            later(functools.partial(_record_exit_of, weakref.ref(self), node))

    def _note_exit(self, node: int, code: int) -> None:
        """The ``node_exit`` event and terminal entry of a reaped agent (under ``_exit_lock``)."""
        cause = self._harmed.get(node)
        how = {"exitcode": code, "signal": None} if code >= 0 else {"exitcode": None, "signal": -code}
        self._harness_events.emit("node_exit", target_node=node, cause=cause, **how)
        if cause is not None and node not in self._terminal:
            self._record_terminal(node, cause, **how)
        self._exits[node] = code

    def _record_terminal(self, node: int, cause: str, **how: Any) -> None:
        """A terminal ``state`` entry on ``node``'s own timeline, written by the harness, unless
        the agent's own last state already was final."""
        states = self.timeline.states(node)
        if states and states[-1] in _FINAL:
            return
        code = how.get("exitcode")
        state = WorkerState.SUCCEEDED if cause == "node_leave" and code == 0 else WorkerState.FAILED
        self._terminal.add(node)
        self._harness_events.emit("state", node=node, state=state.value, source=HARNESS, cause=cause, **how)

    def _await_exit(self, node: int) -> None:
        """Until the agent of ``node`` (just SIGKILLed) was reaped and its exit recorded;
        ``FaultError`` if that does not happen within ``reap_timeout`` (the kill methods
        promise a reaped agent and its terminal entry: never return as if they had one)."""
        if not self.bus.wait_until(lambda: node in self._exits, self.reap_timeout, lifecycle=True):
            raise FaultError(f"node {node}'s agent (pid {self._node(node).pid}) was SIGKILLed but never "
                             f"reaped within {self.reap_timeout:g}s, so its exit and terminal entry are "
                             "not on the timeline (stuck in the kernel, or its parent, the node fork "
                             "server, is not reaping)")

    def _await_stop(self, node: int) -> None:
        """Until the agent of ``node`` (just SIGSTOPped) is stopped (or gone), so nothing it
        writes can follow the terminal entry; a bounded poll of one process."""
        pid = self._node(node).pid
        deadline = time.monotonic() + self.reap_timeout
        pause = 0.0005
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return
            except ChildProcessError:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def agent_log(self, node: int) -> str:
        try:
            with open(os.path.join(self._node(node).directory, "agent.log"), errors="replace") as fp:
                return fp.read()
        except FileNotFoundError:
            return ""

    # -- observing -----------------------------------------------------------------------

    def _latest_starts(self, node: int) -> dict[int, dict[str, Any]]:
        self._node(node)
        starts = self.timeline.events("worker_start", node)
        latest: dict[int, dict[str, Any]] = {}
        for start in starts:  # time-ordered: the last start of each local rank wins
            latest[start["local_rank"]] = start
        return latest

    def worker_pids(self, node: int) -> dict[int, int]:
        """local_rank -> pid of the node's current workers (alive, same process as started)."""
        return {rank: s["worker_pid"] for rank, s in self._latest_starts(node).items()
                if is_same_process(s["worker_pid"], s.get("start_time"))}

    def _latest_state(self, node: int) -> WorkerState | None:
        self._node(node)
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
            self._node(node)
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

    # -- faults --------------------------------------------------------------------------

    def _fault(self, kind: str, **fields: Any) -> None:
        """Record a fault the harness is about to apply (its target already resolved); a
        scheduled one leaves ``pending_faults()`` atomically with this write."""
        self._record_action("fault", fault=kind, **fields)

    def _record_action(self, event: str, **fields: Any) -> None:
        """Write the event of something the harness does to the job (a ``fault``, a
        ``heal``); a scheduled action fires atomically with the write."""
        if self._scheduler is None:
            self._harness_events.emit(event, **fields)
            return
        with self._scheduler.recording():
            self._harness_events.emit(event, **fields)

    def _check_local_rank(self, node: int, local_rank: int) -> None:
        self._node(node)
        n = self.cluster.nproc_per_node
        if not isinstance(local_rank, int) or not 0 <= local_rank < n:
            raise ConfigError("local_rank", local_rank, f"is not a worker of node {node} "
                              f"(local ranks: 0..{n - 1}, nproc_per_node={n})")

    def _worker_pid(self, node: int, local_rank: int) -> int:
        """The pid of a live worker (resolved before the fault is recorded, so a fault that
        cannot hit its target is never recorded as fired)."""
        self._check_local_rank(node, local_rank)
        pids = self.worker_pids(node)
        if local_rank not in pids:
            raise TargetNotReady("local_rank", local_rank, f"has no running worker on node {node} "
                                 f"now (running: {sorted(pids)})")
        return pids[local_rank]

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

    def heal(self, node: int | None = None) -> None:
        """End node ``node``'s network faults and the storage faults of its disk (``node=None``:
        every node's, and the shared filesystem's)."""
        if node is not None:
            self._node(node)
        storage = self.storage.heal(node)
        if self.network.mode != "netns" and not storage:
            NetworkFaults.heal(self, node)  # nothing to heal: says network faults need namespaces
            return
        params = self.network.heal(node).params if self.network.mode == "netns" else {}
        self._record_action("heal", **({"target_node": node} if node is not None else {}), **params,
                            **({"storage": storage} if storage else {}))

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
                rank, step = entry.trigger.rank, entry.trigger.step
                self._harness_events.emit("fault_armed", fault="worker_exit_order", rank=rank,
                                          step=step, exit_code=crash.exit_code)
                path = write_exit_order(self.orders_dir, rank, crash.exit_code, step)
                self._order_left(path, entry.describe(), f"rank {rank} reported no step {step} — does "
                                 "the script call harness.report_step?")
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

    def _order_left(self, path: str, what: str, why: str) -> None:
        """An exit-code order was left for ``report_step`` (it fires when obeyed)."""
        self._orders[path] = (what, why)

    def never_fired(self) -> list[tuple[str, str]]:
        """(fault, why) of every fault of the caller's own still not fired: scheduled ones
        pending (chaos faults excepted: they may not fire), and exit-code orders no worker
        obeyed (no ``report_step`` at that step)."""
        chaos = {id(e) for e in self.chaos_schedule}
        pending = self._scheduler.never_fired() if self._scheduler else []
        reasons = [(entry.describe(), why) for entry, why in pending if id(entry) not in chaos]
        reasons += [(what, why) for path, (what, why) in self._orders.items() if os.path.exists(path)]
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
        ``golden=True`` (the workers then digest their final state)."""
        from harness.sim.golden import compare
        from harness.sim.twin import job_record, twin_record

        if not self.finished():
            raise ElasticError(f"job {self.run_id} is still running: wait() for it before compare_golden()")
        cache = cache_dir if cache_dir is not None else self.cluster.golden_cache
        twin, cached = twin_record(self, timeout, cache)
        diff = compare(job_record(self), twin, self.cluster.golden_rtol if rtol is None else rtol)
        self._harness_events.emit("golden", diverged=diff.diverged, first=diff.first, cached=cached,
                                  steps_compared=diff.steps_compared, rtol=diff.rtol, note=diff.note)
        return diff

    # -- the end -------------------------------------------------------------------------

    def _running(self) -> list[int]:
        # a snapshot: the fault thread may add a node (join) while we wait
        return [i for i, n in list(self.nodes.items()) if i not in self.frozen_nodes and n.alive()]

    def wait(self, timeout: float = 120, allow_unfired: bool = False) -> JobResult:
        """Wait for every node agent to finish (nodes the harness froze excepted: they
        never will; close() kills them); the merged result. Raises ``FaultError`` as soon
        as a scheduled fault could not be applied, and ``FaultNotFired`` (saying why for
        each) if the job ended with faults of the caller's still not fired, unless
        ``allow_unfired`` (chaos faults never count: ``unfired_faults()`` lists them)."""
        if not self._wait(lambda: not self._running(), timeout, lifecycle=True):
            running = self._running()
            raise TimeoutError(f"job {self.run_id} did not finish within {timeout:g}s; nodes "
                               f"{running} still running\n{self.timeline.format()}")
        if not allow_unfired:
            unfired = self.never_fired()
            if unfired:
                raise FaultNotFired(unfired)
        return self.result()

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
        """How long a node cut off from the store may keep its workers: the heartbeat
        timeout (``rdzv_conf``, else c10d's 0.8 s), the workers' stop grace, and 3 s of
        slack for a loaded machine (the invariant is about fencing, not about speed)."""
        heartbeat = float(self.cluster.rdzv_conf.get("heartbeat_timeout", 0.8))
        return heartbeat + self.cluster.shutdown_timeout + 3.0

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
                self._harm(index, "close")
                signal_process_group(node.pid, signal.SIGCONT)
                signal_process_group(node.pid, signal.SIGKILL)
            node.popen.wait()
            self._record_exit(index)
        _, alive = psutil.wait_procs(victims, timeout=5)
        self.storage.close()  # after every process that could be inside it; reports what is unhealed
        self.bus.close()
        self._harness_events.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self.network is not None:  # after every process in it: a live one pins a namespace
            self.network.close()
        return [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE]

    def __repr__(self) -> str:
        return f"Job(run_id={self.run_id}, nodes={ {i: n.name for i, n in self.nodes.items()} })"


def _record_exit_of(job_ref: weakref.ref[Job], index: int) -> None:
    """The bus's exit callback holds the job weakly: an abandoned Cluster (and its jobs) must
    stay collectable, so that the garbage collector can close it."""
    job = job_ref()
    if job is not None:
        job._record_exit(index)


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

