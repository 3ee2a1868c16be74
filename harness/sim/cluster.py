"""Simulated multi-node elastic jobs on one machine.

Each node is a real agent process (``python -m harness.sim.nodes.main``) in its own process
group, with its own loopback address (127.0.0.<n>), temp dir and readable name, and its
own workers. Workers are forked from a zygote (``WarmPool``): the cluster's own, or one
the caller shares across clusters so the second cluster costs no torch import. With
``hosts=[...]`` each node's agent runs on a host over SSH instead, a script or module only:
where nodes run is the cluster's ``place`` (``harness.sim.places``; docs/hosts.md).

Ownership is explicit: everything the cluster starts (node agents, workers, the store
server or etcd, its private pool, temp dirs, FIFOs) ends with ``close()`` (or the end of
the ``with`` block, or garbage collection of an unclosed cluster, with a ResourceWarning),
and ``close()`` proves it; a shared pool belongs to whoever created it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError, ElasticError
from harness.procs import ZYGOTE_ENV
from harness.settings import DEFAULT_MAX_RESTARTS, DEFAULT_MONITOR_INTERVAL
from harness.sim.config import ClusterConfig
from harness.sim.errors import ClusterLeakError
from harness.sim.job import Job, JobResult, fifos_under
from harness.sim.leftovers import owned_tempdir
from harness.sim.nodes.bytecode import ensure_compiled
from harness.sim.nodes.labels import NameMaker
from harness.sim.nodes.pool import WarmPool, resolve_pool
from harness.sim.places import GpuSplit, Place, place_of
from harness.sim.resources import unhealed_message as resources_unhealed
from harness.sim.storage.mount import sweep
from harness.sim.truth.invariants import InvariantViolation
from harness.sim.truth.net_invariants import unhealed_message

if TYPE_CHECKING:
    from harness.sim.faults.chaos import ChaosConfig, JobFacts

__all__ = ["Cluster", "ClusterConfig", "Job", "JobResult", "ClusterLeakError"]


def _unmount_under(path: str) -> None:
    """Detach the job filesystems a dead owner left mounted under ``path``."""
    sweep(under=path)


class Cluster:
    """A simulated cluster. ``with Cluster(nnodes="1:4", nproc_per_node=2) as c: ...``; its
    settings are ``c.config`` (a frozen ``ClusterConfig``), what it owns is its own."""

    def __init__(self, nnodes: str | int = "1:1", nproc_per_node: int = 1, max_restarts: int = DEFAULT_MAX_RESTARTS,
                 rdzv_backend: str = "c10d", monitor_interval: float = DEFAULT_MONITOR_INTERVAL,
                 start_method: str = "zygote", env: dict[str, str] | None = None,
                 rdzv_conf: dict[str, Any] | None = None, shutdown_timeout: float = 5.0,
                 store_host: str = "harness", seed: int = 0, exit_barrier_timeout: float = 30.0,
                 check_invariants: bool = True, chaos: Any = None, gpus: Any = None,
                 pool: WarmPool | None = None, network: str = "auto", golden: bool = False,
                 golden_rtol: float = 0.0, hosts: Sequence[Any] | None = None,
                 placement: Sequence[int] | None = None, slurm: Any = None):
        settings = {name: value for name, value in locals().items() if name not in ("self", "pool")}
        self._open(ClusterConfig(**settings), pool)  # the config checks each keyword, named as written

    @classmethod
    def from_config(cls, config: ClusterConfig, pool: WarmPool | None = None) -> Cluster:
        """A cluster of ``config``'s settings (checked when it was made), forking its workers
        from ``pool`` (None: a pool of its own, closed with the cluster)."""
        if not isinstance(config, ClusterConfig):
            raise ConfigError("config", config, "must be a harness.ClusterConfig")
        cluster = cls.__new__(cls)
        cluster._open(config, pool)
        return cluster

    def _open(self, config: ClusterConfig, pool: WarmPool | None) -> None:
        #: the settings, frozen (``cluster.config.max_restarts``...)
        self.config = config
        from harness.sim.net import resolve_mode

        #: "netns" or "loopback": what ``config.network`` ("auto" too) resolved to on this machine
        self.network = resolve_mode(config.network)
        #: where twins' records are kept between runs (the plugin: pytest's cache dir)
        self.golden_cache: str | None = None
        #: where its jobs' nodes run (``harness.sim.places``): this machine, or its hosts
        self.place: Place = place_of(config)
        self._gpu_plan: GpuSplit | None = None
        # a private pool unless the caller shares one: either way, one owner closes it
        self.pool, self._owns_pool = resolve_pool(pool)
        # named for this process: a run killed before close() leaves it, the next removes it
        # (detaching first the jobs' filesystems it may still hold)
        self.directory = owned_tempdir("elastic_cluster_", before_remove=_unmount_under)
        self.jobs: list[Job] = []
        self._names = NameMaker(config.seed)
        self._closed = False
        if not self._owns_pool:  # a shared pool's next job mounts without waiting for a server
            self.pool.stand_by_storage()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # an exception already on its way out stays the headline: then no invariant check
        self.close(check_invariants=exc_type is None)

    def launch(self, entrypoint: Callable[..., Any] | str, *args: Any, nodes: int | None = None,
               module: bool = False) -> Job:
        """Start a job: a script path (run as torchrun runs it), a module (``module=True``)
        or a picklable callable, on ``nodes`` agents (default: the maximum of nnodes)."""
        if self._closed:
            raise ElasticError("this cluster is closed")
        config = self.config
        count = config.max_nodes if nodes is None else nodes
        if not 1 <= count <= config.max_nodes:
            raise ConfigError("nodes", nodes,
                              f"must be in 1..{config.max_nodes} (nnodes={config.min_nodes}:{config.max_nodes})")
        if isinstance(entrypoint, str) and not module and not os.path.isfile(entrypoint):
            raise ConfigError("entrypoint", entrypoint, "does not exist or is not a file")
        self.place.check_entrypoint(entrypoint)
        self._release_finished()
        job = Job(self, entrypoint, list(args), module)
        job.launched_nodes = count
        self.jobs.append(job)
        self.place.prepare(self.pool, config.start_method)  # here: the pool's imports overlap the store's start
        ensure_compiled()  # every node agent imports the runtime: from bytecode, not source
        try:
            for _ in range(count):
                job.start_node()
        except BaseException:
            job.terminate()
            raise
        if config.chaos is not None:
            self._unleash_chaos(job, count, config.chaos)
        return job

    def _unleash_chaos(self, job: Job, count: int, chaos: ChaosConfig) -> None:
        from harness.sim.faults.chaos import derive_seed, generate_schedule, survivable

        config = self.config
        index = len(self.jobs) - 1
        seed = derive_seed(chaos.seed, f"job{index}")
        given = getattr(chaos, "schedules", None)
        left_out: dict[str, str] = dict(chaos.left_out)
        if given is not None and index < len(given):
            schedule = list(given[index])  # the same entries: callers match them by identity
        else:
            kinds, cannot_here = self.place.chaos_kinds(chaos.kinds, config.max_nodes)  # what its place allows
            left_out.update(cannot_here)
            if not chaos.overload:  # what the job can survive by its own configuration
                kinds, cannot = survivable(kinds, self._chaos_facts(job, count, chaos))
                left_out.update(cannot)
            schedule = generate_schedule(seed, kinds, config.min_nodes, config.max_nodes,
                                         config.nproc_per_node, config.max_restarts, chaos.overload,
                                         chaos.max_faults, chaos.horizon, initial_nodes=count,
                                         reserved_nodes=chaos.reserved_nodes,
                                         protected_nodes=(0,) if config.store_host == "node0" else ())
        job.chaos_schedule = schedule
        job.harness_events.emit("chaos_schedule", seed=seed, given=given is not None and index < len(given),
                                faults=[entry.describe() for entry in schedule],
                                **({"left_out": left_out} if left_out else {}))
        job.scheduler.adopt_chaos(schedule)  # its events say chaos; its heals come by the job's end
        job.schedule(schedule)
        for observer in chaos.on_job:
            observer(job)

    def _chaos_facts(self, job: Job, count: int, chaos: ChaosConfig) -> JobFacts:
        """What chaos must know of ``job`` (started on ``count`` nodes) to draw only faults it
        can survive: its nodes, its watchdog, and what its place lacks (``Place.lacks``)."""
        from harness.sim.faults.chaos import JobFacts
        from harness.sim.truth.hangs import runs_watchdog

        config = self.config
        missing = self.place.lacks(self.network)
        return JobFacts(min_nodes=config.min_nodes, max_nodes=config.max_nodes, nodes=count,
                        reserved_nodes=chaos.reserved_nodes, watchdog=runs_watchdog(config.env), missing=missing)

    def fault_free_copy(self) -> Cluster:
        """A new cluster of this one's settings, sharing its pool, for the fault-free twin
        (``harness.sim.truth.twin``): no chaos, ``golden`` on (the twin's workers digest their final
        state), and the network this one resolved to; every other setting as this one's."""
        twin = dataclasses.replace(self.config, chaos=None, golden=True, network=self.network)
        return type(self).from_config(twin, pool=self.pool)

    def _release_finished(self) -> None:
        """End what every finished job still holds (its threads, descriptors, namespaces,
        mounts, cgroups) before the next starts: a cluster that runs jobs in a row then holds
        one job's resources, not all of theirs (else each finished job would keep three
        threads and some twenty descriptors to the close, and a few dozen jobs in a row would
        run out of descriptors). Its timeline (re-read from its file when asked), result and
        verdicts stay; what it left unhealed or alive is said at the close."""
        for job in self.jobs:
            if job.released is not None or not job.finished():
                continue
            job.scheduler.fire_at_end()
            job.close_warnings += self._unhealed(job)
            job.released = job.terminate()
            job.timeline.forget()

    @staticmethod
    def _unhealed(job: Job) -> list[Warning]:
        """A warning for each kind of lasting fault of the job's own still in place."""
        return [UserWarning(f"job {job.run_id}: {unhealed}")
                for unhealed in (unhealed_message(job.network.open_faults()),
                                 resources_unhealed(job.resources.open_faults())) if unhealed]

    def close(self, check_invariants: bool = True) -> None:
        """End every job (SIGKILL what is left), prove nothing survived (no process, no
        FIFO), then check every job's invariants (raises ``InvariantViolation``)."""
        if self._closed:
            return
        self._closed = True
        leaks: list[str] = []
        finished = {id(job): job.finished() for job in self.jobs}
        # unhealed faults are reported, not failed (a test may mean to end partitioned), and
        # last: under -W error a warning is raised, and everything must be closed by then
        given: list[Warning] = []
        for job in self.jobs:
            if job.released is None:
                job.scheduler.fire_at_end()  # chaos's lasting faults end with the job
                given += self._unhealed(job)
        for job in self.jobs:
            leaks.extend(job.terminate() if job.released is None else job.released)
            given += job.close_warnings
        leaks.extend(self.place.close())  # once every job ended: an allocation of its own goes
        for job in self.jobs:  # an agent that ended on its own must have removed its FIFOs
            for index, node in job.nodes.items():
                if index not in job.killed_nodes:
                    leaks.extend(f"FIFO {path}" for path in fifos_under(node.directory))
        violations = []
        if check_invariants and self.config.check_invariants:
            for job in self.jobs:
                problems = job.invariant_problems(finished[id(job)])
                if problems:
                    violations.append((job, problems))
        if self._owns_pool:
            self.pool.close()
        else:
            self.pool.stand_by_storage()  # for the next cluster: started while nothing runs
        shutil.rmtree(self.directory, ignore_errors=True)
        for warning in given:
            warnings.warn(warning, stacklevel=2)
        if leaks:
            raise ClusterLeakError("still alive after close(): " + ", ".join(leaks))
        if violations:
            job, problems = violations[0]
            raise InvariantViolation(problems, job.timeline)

    def new_node_label(self, index: int) -> str:
        """A display label for a new node ``index`` of one of this cluster's jobs: seeded
        (the same seed names nodes alike), unique within the cluster."""
        return self._names.next(index)

    def zygote_path(self) -> str:
        """Socket path of the zygote this cluster's workers are forked from (as soon as it
        listens: node agents need not wait for its torch import)."""
        return self.pool.address()

    def zygote_env(self) -> dict[str, str]:
        """What a node agent's environment needs to fork its workers from this cluster's
        zygote (the runtime names the variable: ``harness.procs.ZYGOTE_ENV``)."""
        return {ZYGOTE_ENV: self.zygote_path()}

    def __del__(self) -> None:
        # an unclosed cluster still owns processes: end them rather than leak them
        if getattr(self, "_closed", True) or sys.is_finalizing():
            return  # at interpreter exit PDEATHSIG ends our processes, finalizers the rest
        warnings.warn(f"{self!r} was never closed; killing what it started (use `with "
                      "Cluster(...)` or call close())", ResourceWarning, stacklevel=2)
        try:
            self.close(check_invariants=False)
        except ElasticError as e:
            warnings.warn(f"closing an abandoned cluster: {e}", ResourceWarning, stacklevel=2)

    @property
    def gpu_plan(self) -> GpuSplit:
        """How the place's GPUs are split between node slots (this machine's:
        ``harness.sim.nodes.gpus.GpuPlan``; with hosts each host's between the slots placed on it)."""
        if self._gpu_plan is None:
            self._gpu_plan = self.place.gpu_split()
        return self._gpu_plan

    @property
    def backend(self) -> str:
        """The process-group backend that fits: ``nccl`` when every worker has a GPU of
        its own, else ``gloo``."""
        backend: str = self.gpu_plan.backend
        return backend

    def gpus_for(self, node: int) -> tuple[str, ...]:
        """``CUDA_VISIBLE_DEVICES`` ids of node slot ``node`` (0..max_nodes-1; empty
        without GPUs). A node started later takes the lowest slot no live node holds."""
        slot: tuple[str, ...] = self.gpu_plan.slot(node)
        return slot

    def __repr__(self) -> str:
        config = self.config
        return (f"Cluster(nnodes={config.min_nodes}:{config.max_nodes}, nproc_per_node={config.nproc_per_node}, "
                f"network={self.network}, jobs={len(self.jobs)})")


