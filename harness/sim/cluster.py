"""Simulated multi-node elastic jobs on one machine.

Each node is a real agent process (``python -m harness.sim.node_main``) in its own process
group, with its own loopback address (127.0.0.<n>), temp dir and readable name, and its
own workers. Workers are forked from one zygote per harness process (torch imported
once for every cluster), so the second job costs no torch import. Everything the
cluster starts dies with it; ``close()`` proves it.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.agent import RunResult, WorkerState
from harness.errors import ConfigError, ElasticError, ProcessFailure
from harness.events import EVENTS_ENV, NODE_ENV, EventWriter
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
from harness.procs import is_same_process, signal_process_group
from harness.sim.invariants import InvariantViolation, JobFacts, check_timeline
from harness.sim.timeline import Timeline

__all__ = ["Cluster", "Job", "JobResult", "ClusterLeakError"]

_AGENT_GRACE = 10.0


class ClusterLeakError(ElasticError):
    """Something the cluster started was still alive after ``close()`` tried to end it."""


# -- the shared zygote --------------------------------------------------------------------

_zygote: Any = None


def start_shared_zygote() -> None:
    """Start this process's zygote if it is not running, without waiting for it: its torch
    import then overlaps whatever the caller does next (the store server's start)."""
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        from harness.procs import ZygoteServerProcess

        _zygote = ZygoteServerProcess()
        atexit.register(_close_zygote)


def shared_zygote_path() -> str:
    """Socket path of this process's zygote, started on first use (torch imported once)."""
    start_shared_zygote()
    _zygote.wait_ready()
    return _zygote.path


def _close_zygote() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


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


class Cluster:
    """A simulated cluster. ``with Cluster(nnodes="1:4", nproc_per_node=2) as c: ...``"""

    def __init__(self, nnodes: str | int = "1:1", nproc_per_node: int = 1, max_restarts: int = 3,
                 rdzv_backend: str = "c10d", monitor_interval: float = 0.1,
                 start_method: str = "zygote", env: dict[str, str] | None = None,
                 rdzv_conf: dict[str, Any] | None = None, shutdown_timeout: float = 5.0,
                 store_host: str = "harness", seed: int = 0, exit_barrier_timeout: float = 30.0,
                 check_invariants: bool = True, chaos: Any = None, gpus: Any = None):
        from harness.run import parse_min_max_nnodes

        self.min_nodes, self.max_nodes = parse_min_max_nnodes(str(nnodes))
        if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
            raise ConfigError("nproc_per_node", nproc_per_node, "must be an int >= 1")
        if store_host not in ("harness", "node0"):
            raise ConfigError("store_host", store_host, "must be 'harness' or 'node0'")
        self.nproc_per_node = nproc_per_node
        self.max_restarts = max_restarts
        self.rdzv_backend = rdzv_backend
        self.monitor_interval = monitor_interval
        self.start_method = start_method
        self.env = dict(env or {})
        self.rdzv_conf = dict(rdzv_conf or {})
        self.shutdown_timeout = shutdown_timeout
        self.store_host = store_host
        self.seed = seed
        self.exit_barrier_timeout = exit_barrier_timeout
        self.check_invariants = check_invariants
        self.chaos = chaos  # harness.sim.chaos.ChaosConfig: a seeded fault schedule per job
        self._gpus = gpus  # None: detect (no torch import); an int or ids: injected
        self._gpu_plan: Any = None
        self.directory = tempfile.mkdtemp(prefix="elastic_cluster_")
        self.jobs: list[Job] = []
        self._names = _NameMaker(seed)
        self._closed = False

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # an exception already on its way out stays the headline: then no invariant check
        self.close(check_invariants=exc_type is None)

    def launch(self, entrypoint: Callable[..., Any] | str, *args: Any, nodes: int | None = None,
               module: bool = False) -> "Job":
        """Start a job: a script path (run as torchrun runs it), a module (``module=True``)
        or a picklable callable, on ``nodes`` agents (default: the maximum of nnodes)."""
        if self._closed:
            raise ElasticError("this cluster is closed")
        count = self.max_nodes if nodes is None else nodes
        if not 1 <= count <= self.max_nodes:
            raise ConfigError("nodes", nodes, f"must be in 1..{self.max_nodes} (nnodes={self.min_nodes}:{self.max_nodes})")
        if isinstance(entrypoint, str) and not module and not os.path.isfile(entrypoint):
            raise ConfigError("entrypoint", entrypoint, "does not exist or is not a file")
        job = Job(self, entrypoint, list(args), module)
        self.jobs.append(job)
        if self.start_method == "zygote":
            start_shared_zygote()  # its torch import overlaps the store's start
        try:
            for _ in range(count):
                job.add_node()
        except BaseException:
            job.terminate()
            raise
        if self.chaos is not None:
            self._unleash_chaos(job, count)
        return job

    def _unleash_chaos(self, job: "Job", count: int) -> None:
        from harness.sim.chaos import derive_seed, generate_schedule

        chaos = self.chaos
        index = len(self.jobs) - 1
        seed = derive_seed(chaos.seed, f"job{index}")
        given = getattr(chaos, "schedules", None)
        if given is not None and index < len(given):
            schedule = list(given[index])  # the same entries: callers match them by identity
        else:
            schedule = generate_schedule(seed, chaos.kinds, self.min_nodes, self.max_nodes,
                                         self.nproc_per_node, self.max_restarts, chaos.overload,
                                         chaos.max_faults, chaos.horizon, initial_nodes=count)
        job.chaos_schedule = schedule
        job._harness_events.emit("chaos_schedule", seed=seed, given=given is not None and index < len(given),
                                 faults=[entry.describe() for entry in schedule])
        job.schedule(schedule)
        for observer in chaos.on_job:
            observer(job)

    def close(self, check_invariants: bool = True) -> None:
        """End every job (SIGKILL what is left), prove nothing survived (no process, no
        FIFO), then check every job's invariants (raises ``InvariantViolation``)."""
        if self._closed:
            return
        self._closed = True
        leaks: list[str] = []
        finished = {id(job): job.finished() for job in self.jobs}
        for job in self.jobs:
            leaks.extend(job.terminate())
        for job in self.jobs:  # an agent that ended on its own must have removed its FIFOs
            for index, node in job.nodes.items():
                if index not in job.killed_nodes:
                    leaks.extend(f"FIFO {path}" for path in _fifos(node.directory))
        violations = []
        if check_invariants and self.check_invariants:
            for job in self.jobs:
                problems = job.invariant_problems(finished[id(job)])
                if problems:
                    violations.append((job, problems))
        shutil.rmtree(self.directory, ignore_errors=True)
        if leaks:
            raise ClusterLeakError("still alive after close(): " + ", ".join(leaks))
        if violations:
            job, problems = violations[0]
            raise InvariantViolation(problems, job.timeline)

    @property
    def gpu_plan(self) -> Any:
        """How this machine's GPUs are split between node slots (``harness.sim.gpus.GpuPlan``)."""
        if self._gpu_plan is None:
            from harness.sim.gpus import GpuPlan

            self._gpu_plan = GpuPlan.resolve(self._gpus, self.max_nodes, self.nproc_per_node,
                                             {**os.environ, **self.env})
        return self._gpu_plan

    @property
    def backend(self) -> str:
        """The process-group backend that fits: ``nccl`` when every worker has a GPU of
        its own, else ``gloo``."""
        return self.gpu_plan.backend

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """``CUDA_VISIBLE_DEVICES`` ids of node slot ``node`` (0..max_nodes-1; empty
        without GPUs). A node started later takes the lowest slot no live node holds."""
        return self.gpu_plan.slot(node)

    def __repr__(self) -> str:
        return (f"Cluster(nnodes={self.min_nodes}:{self.max_nodes}, nproc_per_node={self.nproc_per_node}, "
                f"jobs={len(self.jobs)})")


class _NameMaker:
    """Readable, seeded node names (Faker), unique within a cluster."""

    def __init__(self, seed: int):
        self._seed = seed
        self._faker: Any = None
        self._used: set[str] = set()

    def next(self, index: int) -> str:
        if self._faker is None:
            from faker import Faker

            self._faker = Faker()
            self._faker.seed_instance(self._seed)
        for _ in range(20):
            name = f"{self._faker.first_name().lower()}-{index}"
            if name not in self._used:
                self._used.add(name)
                return name
        return f"node-{index}"


class Job:
    """A running job: its nodes, its timeline, and the faults you can inject."""

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
        self._scheduler: _Scheduler | None = None
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
        addr = f"127.0.0.{index + 1}"
        directory = os.path.join(self.directory, f"node{index}")
        os.makedirs(os.path.join(directory, "tmp"))
        rdzv = self._rendezvous_settings()
        entrypoint, args = self._command()
        config = LaunchConfig(
            min_nodes=cluster.min_nodes, max_nodes=cluster.max_nodes,
            nproc_per_node=cluster.nproc_per_node, run_id=self.run_id, role="default",
            rdzv_endpoint=rdzv["endpoint"], rdzv_backend=rdzv["backend"],
            rdzv_configs={**rdzv["configs"], **(rdzv.get("host_configs", {}) if index == 0 else {}),
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
            env["HARNESS_ZYGOTE"] = shared_zygote_path()
        from harness.procs import die_with_parent

        parent = os.getpid()
        log = open(os.path.join(directory, "agent.log"), "wb")
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "harness.sim.node_main", spec_path], env=env, cwd=os.getcwd(),
                stdin=subprocess.DEVNULL, stdout=None, stderr=log, start_new_session=True,
                preexec_fn=lambda: die_with_parent(parent),
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
                self._scheduler = _Scheduler(self)
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
        return [f"pid {p.pid}" for p in alive if p.status() != psutil.STATUS_ZOMBIE]

    def __repr__(self) -> str:
        return f"Job(run_id={self.run_id}, nodes={[n.name for n in self.nodes.values()]})"


@dataclass(eq=False)
class _Pending:
    """A scheduled fault not fired yet; ``armed_at`` None: waiting for its predecessor."""

    entry: ScheduledFault
    armed_at: float | None
    successor: "_Pending | None" = None
    fired: bool = False


class _Scheduler:
    """Fires scheduled faults when their triggers are met (one thread per job)."""

    def __init__(self, job: Job):
        import threading

        self._job = job
        self._entries: list[_Pending] = []
        self._last: _Pending | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"faults-{job.run_id}", daemon=True)
        self._thread.start()

    def add(self, entry: ScheduledFault) -> None:
        with self._lock:
            pending = _Pending(entry, time.monotonic())
            previous = self._last
            if entry.after_previous and previous is not None and not previous.fired:
                pending.armed_at = None  # armed when ``previous`` fires
                previous.successor = pending
            self._last = pending
            self._entries.append(pending)

    def pending(self) -> list[ScheduledFault]:
        with self._lock:
            return [p.entry for p in self._entries]

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            now = time.monotonic()
            with self._lock:
                due = [p for p in self._entries
                       if p.armed_at is not None and p.entry.trigger.ready(self._job, p.armed_at, now)]
                for p in due:
                    self._entries.remove(p)
                    p.fired = True
                    if p.successor is not None:
                        p.successor.armed_at = now
            for p in due:
                try:
                    p.entry.fault.apply(self._job)
                except Exception as e:  # a fault that cannot fire is reported, not fatal
                    self.errors.append(f"{p.entry.describe()}: {e}")
                    self._job._harness_events.emit("fault_error", description=p.entry.describe(),
                                                   error=str(e))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _fifos(directory: str) -> list[str]:
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
