"""A running simulated job: its node agents, its timeline, the faults you can inject.

``Cluster.launch`` creates one; the nodes are real agent processes
(``python -m harness.sim.node_main``) whose events feed the job's ``Timeline``.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from harness.agent import RunResult, WorkerState
from harness.errors import ConfigError, ElasticError, ProcessFailure
from harness.events import EVENTS_ENV, NODE_ENV, EventWriter
from harness.procs import is_same_process, signal_process_group
from harness.sim.faults import (
    ORDERS_ENV,
    AtStep,
    Fault,
    Immediately,
    ScheduledFault,
    Trigger,
    WorkerCrash,
    write_exit_order,
)
from harness.sim.invariants import InvariantViolation, JobFacts, check_timeline
from harness.sim.job_network import NetworkFaults
from harness.sim.net import NODE_INTERFACE, Network
from harness.sim.scheduler import FaultScheduler
from harness.sim.timeline import Timeline

if TYPE_CHECKING:
    from harness.sim.cluster import Cluster

__all__ = ["Job", "JobResult", "NodeProcess", "fifos_under"]


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


@dataclass
class NodeProcess:
    index: int
    name: str
    addr: str
    directory: str
    popen: subprocess.Popen
    result_path: str
    slot: int = 0
    gpus: tuple[str, ...] = ()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def result(self) -> RunResult | None:
        try:
            with open(self.result_path, "rb") as fp:
                return pickle.load(fp)
        except (FileNotFoundError, EOFError, pickle.UnpicklingError):
            return None


class Job(NetworkFaults):
    """A running job: its nodes, its timeline, and the faults you can inject (process faults
    here, network faults from ``NetworkFaults``)."""

    def __init__(self, cluster: Cluster, entrypoint: Callable[..., Any] | str, args: list[Any],
                 module: bool):
        self.cluster = cluster
        self.entrypoint = entrypoint
        self.args = args
        self.module = module
        self.run_id = uuid.uuid4().hex[:12]
        self.directory = tempfile.mkdtemp(prefix=f"job_{self.run_id}_", dir=cluster.directory)
        self.events_path = os.path.join(self.directory, "events.jsonl")
        open(self.events_path, "ab").close()
        self.timeline = Timeline(self.events_path)
        self.nodes: dict[int, NodeProcess] = {}
        self.orders_dir = os.path.join(self.directory, "orders")
        os.makedirs(self.orders_dir)
        self._harness_events = EventWriter(self.events_path, "harness", self.run_id)
        self._rdzv: dict[str, Any] | None = None
        self._store: Any = None
        #: the nodes' network (built with the first node: the store lives in it too)
        self.network: Network = None  # type: ignore[assignment]
        self._scheduler: FaultScheduler | None = None
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

    def _command(self) -> tuple[Callable[..., Any] | str, list[Any]]:
        if callable(self.entrypoint):
            return self.entrypoint, list(self.args)
        head = ["-u", "-m"] if self.module else ["-u"]
        return sys.executable, [*head, self.entrypoint, *map(str, self.args)]

    def add_node(self) -> int:
        """Start one more node agent (scale up when the job is running); its index."""
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
        rdzv = self._rendezvous_settings()
        entrypoint, args = self._command()
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
        env = {**os.environ, **cluster.env, EVENTS_ENV: self.events_path, NODE_ENV: name,
               ORDERS_ENV: self.orders_dir, "TMPDIR": os.path.join(directory, "tmp")}
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
        from harness.procs import die_with_parent

        parent = os.getpid()
        enter = self.network.enter(index)

        def preexec() -> None:  # dies with the harness; lives in its node's network
            die_with_parent(parent)
            if enter is not None:
                enter()

        log = open(os.path.join(directory, "agent.log"), "wb")
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "harness.sim.node_main", spec_path], env=env, cwd=os.getcwd(),
                stdin=subprocess.DEVNULL, stdout=None, stderr=log, start_new_session=True,
                preexec_fn=preexec,
            )
        finally:
            log.close()
        self.nodes[index] = NodeProcess(index, name, addr, directory, popen, spec.result_path, slot, gpus)
        if index >= cluster.max_nodes:
            pass  # extra nodes wait in the rendezvous for a free slot, as in torchrun
        return index

    def _free_slot(self) -> int:
        """The lowest node slot (GPU slice) no live node of this job holds."""
        held = {n.slot for n in self.nodes.values() if n.alive()}
        free = [s for s in range(self.cluster.max_nodes) if s not in held]
        return free[0] if free else len(self.nodes) % self.cluster.max_nodes

    def node_name(self, node: int) -> str:
        return self._node(node).name

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """The ``CUDA_VISIBLE_DEVICES`` ids node ``node`` was given (empty without GPUs)."""
        return self._node(node).gpus

    def _node(self, node: int) -> NodeProcess:
        try:
            return self.nodes[node]
        except KeyError:
            raise ConfigError("node", node, f"is not one of this job's nodes {sorted(self.nodes)}") from None

    def agent_log(self, node: int) -> str:
        try:
            with open(os.path.join(self._node(node).directory, "agent.log"), errors="replace") as fp:
                return fp.read()
        except FileNotFoundError:
            return ""

    # -- observing -----------------------------------------------------------------------

    def _latest_starts(self, node: int) -> dict[int, dict]:
        starts = self.timeline.events("worker_start", self._node(node).name)
        latest: dict[int, dict] = {}
        for start in starts:  # time-ordered: the last start of each local rank wins
            latest[start["local_rank"]] = start
        return latest

    def worker_pids(self, node: int) -> dict[int, int]:
        """local_rank -> pid of the node's current workers (alive, same process as started)."""
        return {rank: s["worker_pid"] for rank, s in self._latest_starts(node).items()
                if is_same_process(s["worker_pid"], s.get("start_time"))}

    def _latest_state(self, node: int) -> WorkerState | None:
        states = self.timeline.states(self._node(node).name)
        return states[-1] if states else None

    def first_healthy_time(self) -> float | None:
        """Monotonic time the job first had a HEALTHY node (chaos times faults from it)."""
        for event in self.timeline.events("state"):
            if event["state"] == WorkerState.HEALTHY.value:
                return event["mono"]
        return None

    def in_state(self, state: WorkerState, node: int | None = None) -> bool:
        """Is ``node`` (default: every running node) in ``state`` now (with live workers
        when the state is HEALTHY)?"""
        targets = [node] if node is not None else [i for i, n in self.nodes.items() if n.alive()]
        if not targets or not all(self._latest_state(i) == state for i in targets):
            return False
        return state != WorkerState.HEALTHY or all(self.worker_pids(i) for i in targets)

    def wait_for_state(self, state: WorkerState, timeout: float = 30, node: int | None = None) -> None:
        """Block until ``node`` (default: every running node) is in ``state``."""
        deadline = time.monotonic() + timeout
        while True:
            if self.in_state(state, node):
                return
            if time.monotonic() > deadline:
                current = {self.nodes[i].name: getattr(self._latest_state(i), "value", None) for i in self.nodes}
                raise TimeoutError(f"nodes did not reach {state.value} within {timeout:g}s "
                                   f"(now {current})\n{self.timeline.format()}")
            time.sleep(0.02)

    def wait_for_recovery(self, timeout: float = 30) -> float:
        """Block until the job recovered from the last fault (every disturbed node
        HEALTHY again, or finished); returns the recovery latency in seconds."""
        deadline = time.monotonic() + timeout
        while self.pending_faults():  # scheduled faults fire first
            if time.monotonic() > deadline:
                raise TimeoutError(f"scheduled faults never fired within {timeout:g}s: "
                                   f"{[e.describe() for e in self.pending_faults()]}")
            time.sleep(0.01)
        while True:
            faults = self.timeline.faults()
            if not faults:
                raise ElasticError("no fault has been injected into this job")
            latency = faults[-1].recovery_latency
            if latency is not None:
                return latency
            if time.monotonic() > deadline:
                raise TimeoutError(f"no recovery from {faults[-1]['fault']} within {timeout:g}s\n"
                                   f"{self.timeline.format()}")
            time.sleep(0.02)

    # -- faults --------------------------------------------------------------------------

    def _fault(self, kind: str, **fields: Any) -> None:
        self._harness_events.emit("fault", fault=kind, **fields)

    def _signal_worker(self, node: int, local_rank: int, sig: int) -> int:
        pids = self.worker_pids(node)
        if local_rank not in pids:
            raise ConfigError("local_rank", local_rank, f"has no running worker on node {node} (workers: {sorted(pids)})")
        pid = pids[local_rank]
        os.kill(pid, sig)
        return pid

    def inject(self, fault: Fault, trigger: Trigger | None = None) -> None:
        """Schedule ``fault`` to fire when ``trigger`` (default: now) is met."""
        self.schedule([ScheduledFault(fault, trigger or Immediately())])

    def schedule(self, entries: list[ScheduledFault]) -> None:
        """Arm a list of scheduled faults; a background thread fires each when due."""
        for entry in entries:
            crash = entry.fault
            if isinstance(crash, WorkerCrash) and crash.exit_code is not None and isinstance(entry.trigger, AtStep):
                # exact (rank, step) crashes are left as orders the worker obeys itself
                self._harness_events.emit("fault_armed", fault="worker_exit_order", rank=entry.trigger.rank,
                                          step=entry.trigger.step, exit_code=crash.exit_code)
                write_exit_order(self.orders_dir, entry.trigger.rank, crash.exit_code, entry.trigger.step)
                continue
            if self._scheduler is None:
                self._scheduler = FaultScheduler(self)
            self._scheduler.add(entry)

    def pending_faults(self) -> list[ScheduledFault]:
        return self._scheduler.pending() if self._scheduler else []

    def order_exit(self, node: int, local_rank: int, exit_code: int) -> None:
        """The worker exits with ``exit_code`` at its next ``report_step``."""
        starts = self._latest_starts(node)
        if local_rank not in starts:
            raise ConfigError("local_rank", local_rank, f"has no worker on node {node}")
        rank = starts[local_rank]["rank"]
        self._harness_events.emit("fault_armed", fault="worker_exit_order", target_node=self.node_name(node),
                                  local_rank=local_rank, rank=rank, exit_code=exit_code)
        write_exit_order(self.orders_dir, rank, exit_code)

    def kill_store_host(self) -> None:
        """The process hosting the rendezvous store dies."""
        if self._store is None:
            raise ConfigError("store_host", self.cluster.store_host,
                              "has no separate store process to lose in this job")
        host = self._store.node
        where = {"target_node": self.node_name(host)} if host is not None else {}
        self._fault("store_host_loss", store=self._store.describe(), **where)
        self._store.kill()

    def kill_worker(self, node: int, local_rank: int, sig: int = signal.SIGKILL) -> None:
        """The worker dies of ``sig``; its agent must notice and restart the group."""
        self._fault("worker_kill", target_node=self.node_name(node), local_rank=local_rank, sig=int(sig))
        self._signal_worker(node, local_rank, sig)

    def hang_worker(self, node: int, local_rank: int) -> None:
        """SIGSTOP: the worker is stuck, not dead."""
        self._fault("worker_hang", target_node=self.node_name(node), local_rank=local_rank)
        self._signal_worker(node, local_rank, signal.SIGSTOP)

    def kill_agent(self, node: int) -> None:
        """The agent dies (SIGKILL); its workers must follow on their own."""
        target = self._node(node)
        self._fault("agent_kill", target_node=target.name)
        _kill(target.pid, signal.SIGKILL)

    def _signal_node(self, node: int, fault: str, sig: int) -> None:
        """``sig`` to the agent and every worker of ``node`` at once (a recorded fault)."""
        self._fault(fault, target_node=self._node(node).name)
        self._signal_node_processes(node, sig)

    def _signal_node_processes(self, node: int, sig: int) -> None:
        target = self._node(node)
        pids = self.worker_pids(node)
        signal_process_group(target.pid, sig)
        for pid in pids.values():
            signal_process_group(pid, sig)

    def kill_node(self, node: int) -> None:
        """Agent and workers SIGKILLed at once (a machine lost)."""
        self._signal_node(node, "node_kill", signal.SIGKILL)

    def remove_node(self, node: int) -> None:
        """Graceful leave: SIGTERM to the agent."""
        target = self._node(node)
        self._fault("node_leave", target_node=target.name)
        _kill(target.pid, signal.SIGTERM)

    def freeze_node(self, node: int) -> None:
        """SIGSTOP the whole node: alive to TCP, silent to heartbeats."""
        self.frozen_nodes.add(node)
        self._signal_node(node, "node_freeze", signal.SIGSTOP)

    def join_node(self) -> int:
        """A new node joins (scale up); recorded as a fault, returns its index."""
        self._fault("node_join", target_node=f"node{len(self.nodes)}")
        return self.add_node()

    # -- the end -------------------------------------------------------------------------

    def wait(self, timeout: float = 120) -> JobResult:
        """Wait for every node agent to finish (nodes the harness froze excepted: they
        never will; close() kills them); the merged result."""
        deadline = time.monotonic() + timeout
        while True:
            # a snapshot: the fault thread may add a node (join) while we wait
            pending = [n for i, n in list(self.nodes.items()) if i not in self.frozen_nodes and n.alive()]
            if not pending:
                return self.result()
            remaining = deadline - time.monotonic()
            try:
                pending[0].popen.wait(max(0.0, remaining))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"job {self.run_id} did not finish within {timeout:g}s; node "
                                   f"{pending[0].name} still running\n{self.timeline.format()}") from None

    def finished(self) -> bool:
        """Every node agent ended on its own."""
        return bool(self.nodes) and all(not n.alive() for n in self.nodes.values())

    def invariant_problems(self, finished: bool | None = None) -> list[str]:
        """The invariants this job broke so far (see harness.sim.invariants)."""
        done = self.finished() if finished is None else finished
        facts = JobFacts(max_restarts=self.cluster.max_restarts,
                         nproc_per_node=self.cluster.nproc_per_node, finished=done,
                         succeeded=(self.result().state == WorkerState.SUCCEEDED) if done else None)
        return check_timeline(self.timeline, facts)

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
            for start in self.timeline.events("worker_start", node.name):
                pid = start["worker_pid"]
                if is_same_process(pid, start.get("start_time")):  # never a reused pid
                    signal_process_group(pid, signal.SIGKILL)
                    _add_process(victims, pid)
            if node.alive():
                self.killed_nodes.add(index)
                signal_process_group(node.pid, signal.SIGCONT)
                signal_process_group(node.pid, signal.SIGKILL)
            node.popen.wait()
        _, alive = psutil.wait_procs(victims, timeout=5)
        self._harness_events.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self.network is not None:  # after every process in it: a live one pins a namespace
            self.network.close()
        return [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE]

    def __repr__(self) -> str:
        return f"Job(run_id={self.run_id}, nodes={[n.name for n in self.nodes.values()]})"


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


def _add_process(into: list, pid: int) -> None:
    import psutil

    try:
        into.append(psutil.Process(pid))
    except psutil.NoSuchProcess:
        pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

