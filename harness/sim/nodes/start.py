"""How a job starts one node agent: its ``LaunchConfig``, its command, its environment and
its process (``Job.start_node`` for ``launch``'s nodes and for ``add_node``'s).

The agent gets the cluster's settings and the rendezvous the job's first node set up
(``rendezvous_settings``: c10d on localhost for a one-node job, else the store the harness
runs: ``harness.sim.nodes.rendezvous_store``); the job's entrypoint with ``{shared}``,
``{node_disk}`` and ``{backend}`` (``Cluster.backend``: ``nccl`` or ``gloo``) filled in; an
environment that names the job's event file, exit-code orders, disks, stacks dir and cgroup,
and the GPUs of the lowest node slot no live node holds. It is forked by the pool's node
server where it can be, in the node's network namespace (``harness.sim.nodes.process.start_node``),
its stdout and stderr going to ``agent.log`` in the node's directory (``agent_log`` reads it
back). The job keeps the handle, records ``node_start`` and has its ledger watch the agent.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from harness.agent import WORKER_IDENTICAL_ENV
from harness.errors import ERROR_FILE_ENV
from harness.events import EVENTS_ENV, NODE_ENV, WAKE_ENV
from harness.procs import STACKS_ENV, WORKER_NICE_ENV, LogsSpecs
from harness.rendezvous import HEARTBEAT_TIMEOUT, KEEP_ALIVE_INTERVAL
from harness.sim.net import NODE_INTERFACE
from harness.sim.nodes.main import WORKER_TMPDIR_ENV
from harness.sim.nodes.process import NodeProcess
from harness.sim.nodes.process import start_node as start_agent_process
from harness.sim.truth.progress import DIGEST_ENV, ORDERS_ENV
from harness.sim.truth.subject import Launched

if TYPE_CHECKING:
    from harness.sim.bus import EventBus
    from harness.sim.config import ClusterConfig
    from harness.sim.nodes.pool import WarmPool
    from harness.sim.nodes.rendezvous_store import StoreHandle

__all__ = ["NODE_DISK_ENV", "SHARED_DIR_ENV", "WORKER_NICE", "NodesCluster", "StartingJob", "agent_log",
           "fill_placeholders", "node_defaults", "rendezvous_settings", "start_agent"]

SHARED_DIR_ENV = "HARNESS_SHARED_DIR"  # the job's shared dir, as workers see it
NODE_DISK_ENV = "HARNESS_NODE_DISK"  # the node's local disk, as its workers see it
#: how much lower the workers' CPU priority is than their agent's (``harness.procs``)
WORKER_NICE = 10
AGENT_LOG = "agent.log"  # in the node's directory: the agent's stdout and stderr


# -- what starting a node needs of its job (``harness.sim.job.Job`` is the implementation) ----


class NodesCluster(Protocol):
    """The job's cluster as a node's start sees it (``harness.sim.cluster.Cluster``)."""

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def pool(self) -> WarmPool:
        """The warm pool (its node server forks the agent)."""
        ...

    @property
    def backend(self) -> str:
        """The process-group backend the workers use (``{backend}`` in a command's args)."""
        ...

    def new_node_label(self, index: int) -> str: ...

    def gpus_for(self, node: int) -> tuple[str, ...]: ...

    def zygote_env(self) -> dict[str, str]: ...


class _Hosts(Protocol):
    """The job's network as a node's start sees it (``harness.sim.net.Network``)."""

    @property
    def nnodes(self) -> int: ...

    @property
    def mode(self) -> str: ...

    def add_node(self) -> int: ...

    def address(self, node: int) -> str: ...

    def namespace_path(self, node: int) -> str | None: ...

    @property
    def store_address(self) -> str: ...

    def enter_store(self) -> Callable[[], None] | None: ...


class _Disks(Protocol):
    """The job's storage part as a node's start sees it (``StorageFaults``)."""

    def add_node(self, node: int) -> None: ...

    def ready(self) -> None: ...

    def disk_of(self, node: int) -> str: ...

    def tmp_of(self, node: int) -> str: ...

    @property
    def scratch_dir(self) -> str: ...


class _Cgroups(Protocol):
    """The job's resource part as a node's start sees it (``ResourceFaults``)."""

    def node_env(self, node: int) -> dict[str, str]: ...


class StartingJob(Launched, Protocol):
    """The job as a node's start sees it: what it runs (``Launched``), its directories and
    event file, its cluster, network, disks and cgroups, and the nodes it has."""

    @property
    def directory(self) -> str: ...

    @property
    def events_path(self) -> str: ...

    @property
    def orders_dir(self) -> str: ...

    @property
    def shared_dir(self) -> str: ...

    @property
    def stacks_dir(self) -> str: ...

    @property
    def nodes(self) -> Mapping[int, NodeProcess]: ...

    @property
    def cluster(self) -> NodesCluster: ...

    @property
    def net(self) -> _Hosts: ...

    @property
    def storage(self) -> _Disks: ...

    @property
    def resources(self) -> _Cgroups: ...

    @property
    def bus(self) -> EventBus: ...


def rendezvous_settings(job: StartingJob) -> tuple[dict[str, Any], StoreHandle | None]:
    """(what every node agent of ``job`` rendezvouses with, the store the harness runs for
    it: None where a one-node job's agent hosts its own). Made once, with the first node,
    inside the job's network."""
    settings = job.cluster.config
    if settings.max_nodes == 1 and settings.rdzv_backend not in ("etcd", "etcd-v2"):
        return {"backend": "c10d", "endpoint": "localhost:0", "configs": {}}, None
    from harness.sim.nodes import rendezvous_store

    return rendezvous_store.rendezvous_for(settings, job)


def start_agent(job: StartingJob, index: int, rdzv: dict[str, Any]) -> NodeProcess:
    """Start node ``index``'s agent (its disk made and served first: its workers must find
    it); its handle, not yet in ``job.nodes``."""
    from harness.launch import LaunchConfig
    from harness.sim.nodes.main import NodeSpec

    cluster = job.cluster
    settings = cluster.config
    name = cluster.new_node_label(index)
    while job.net.nnodes <= index:  # an extra node, past max_nodes
        job.net.add_node()
    addr = job.net.address(index)
    directory = os.path.join(job.directory, f"node{index}")
    os.makedirs(os.path.join(directory, "tmp"))
    job.storage.add_node(index)
    job.storage.ready()  # workers must find the filesystem served
    entrypoint, args = _command(job, index)
    # the workers' logs in the node's directory (``--log-dir``): the agent would remove a temp
    # dir of its own as it ends, and 128 agents ending at once waited up to 0.4 s each on the
    # file system (0.06 s the median) before their results; the cluster removes it at close
    config = LaunchConfig(**launch_fields(settings, job.run_id, index, rdzv, name, addr, rdzv["endpoint"],
                                          launched=job.launched_nodes),
                          logs_specs=LogsSpecs(log_dir=os.path.join(directory, "logs")))
    spec = NodeSpec(config=config, entrypoint=entrypoint, args=args,
                    result_path=os.path.join(directory, "result.pkl"))
    spec_path = os.path.join(directory, "spec.pkl")
    with open(spec_path, "wb") as fp:
        pickle.dump(spec, fp)
    slot = _free_slot(job)
    gpus = cluster.gpus_for(slot)
    env = _environment(job, index, directory, gpus)
    with open(os.path.join(directory, AGENT_LOG), "wb") as log:
        popen = start_agent_process(cluster.pool.node_server(), spec_path, job.net.namespace_path(index), env, log)
    return NodeProcess(index, name, addr, directory, popen, spec.result_path, slot, gpus)


#: the first round's last call, for each node the harness started at once: a loaded machine
#: starts many one after another (64 on 2 cores: over 3 s, and a 1 s last call formed the
#: first round with 33); it costs nothing when they all come (the round closes as the last
#: is in) and bounds the wait for one that never does (a node killed as it started)
FIRST_ROUND_LAST_CALL_PER_NODE = 0.1
#: the nodes a job may have before its keep-alive slows with them: every node reads every
#: peer's heartbeat each keep-alive (N^2 reads an interval), and past this many on 2 cores the
#: store and the keepers fall behind it (128 nodes at 0.1 s: peers taken for lost at the first
#: round). The interval and the heartbeat timeout grow in proportion past it; a dead process is
#: still seen at once (its liveness socket closes), only a silent node takes longer to judge
KEEP_ALIVE_NODES = 16
#: past those nodes, a node lets the rendezvous state settle this long per further node
#: (``settle_time``) before it reads it again after a change, up to ``SETTLE_MAX``: a round
#: that 128 nodes join changes 128 times, and without it every waiter and keeper reads the
#: whole state (some 25 KB) on each change
SETTLE_PER_NODE = 0.001
SETTLE_MAX = 0.1


def launch_fields(settings: ClusterConfig, run_id: str, index: int, rdzv: Mapping[str, Any], name: str,
                  local_addr: str, endpoint: str, last_call: float = 1.0, launched: int = 0) -> dict[str, Any]:
    """The ``LaunchConfig`` fields of node ``index``'s agent: here they make its config, on
    a host its JSON spec (``harness.sim.places.hosts.nodes``). ``endpoint``: the store as the agent reaches it.
    ``last_call``: how long the first round waits for more nodes once it has its minimum
    (a ``rdzv_conf`` of the user's wins); ``launched``: the nodes ``Cluster.launch`` starts
    at once: the first round closes as soon as they are all in (``first_round_nodes``), and
    its last call grows with them."""
    ours: dict[str, Any] = ({"first_round_nodes": launched,
                             "last_call_timeout": max(last_call, FIRST_ROUND_LAST_CALL_PER_NODE * launched)}
                            if launched else {"last_call_timeout": last_call})
    if settings.max_nodes > KEEP_ALIVE_NODES:
        scale = settings.max_nodes / KEEP_ALIVE_NODES
        ours.update(keep_alive_interval=round(KEEP_ALIVE_INTERVAL * scale, 3),
                    heartbeat_timeout=round(HEARTBEAT_TIMEOUT * scale, 3),
                    settle_time=round(min(SETTLE_MAX, SETTLE_PER_NODE * (settings.max_nodes - KEEP_ALIVE_NODES)), 3))
    return {
        "min_nodes": settings.min_nodes, "max_nodes": settings.max_nodes,
        "nproc_per_node": settings.nproc_per_node, "run_id": run_id, "role": "default",
        "rdzv_endpoint": endpoint, "rdzv_backend": rdzv["backend"],
        # the harness knows how many nodes it starts: no 30 s first-round last call
        # waiting for stragglers that will never come (a rdzv_conf of the user's wins)
        "rdzv_configs": {**ours, **rdzv["configs"],
                         **(rdzv.get("host_configs", {}) if index == 0 else {}), **settings.rdzv_conf},
        "max_restarts": settings.max_restarts, "monitor_interval": settings.monitor_interval,
        "start_method": settings.start_method, "local_addr": local_addr,
        "shutdown_timeout": settings.shutdown_timeout, "exit_barrier_timeout": settings.exit_barrier_timeout,
        "node_name": name,
    }


def agent_log(node: NodeProcess) -> str:
    """What ``node``'s agent wrote to its log ("" once the cluster removed its directory)."""
    try:
        with open(os.path.join(node.directory, AGENT_LOG), errors="replace") as fp:
            return fp.read()
    except FileNotFoundError:
        return ""


def _environment(job: StartingJob, index: int, directory: str, gpus: tuple[str, ...]) -> dict[str, str]:
    """Node ``index``'s agent's environment: the harness's own, the cluster's ``env``, and
    what the job tells its agents and workers (a user's value wins where one may)."""
    cluster = job.cluster
    settings = cluster.config
    env = {**os.environ, **settings.env, EVENTS_ENV: job.events_path, NODE_ENV: str(index),
           WAKE_ENV: job.bus.wake_path, ORDERS_ENV: job.orders_dir,
           "TMPDIR": os.path.join(directory, "tmp"), SHARED_DIR_ENV: job.shared_dir,
           NODE_DISK_ENV: job.storage.disk_of(index), WORKER_TMPDIR_ENV: job.storage.tmp_of(index),
           **job.resources.node_env(index)}
    if settings.golden:
        env[DIGEST_ENV] = "1"  # final-state digests for the twin comparison
    env.pop(ERROR_FILE_ENV, None)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    node_defaults(env, settings.nproc_per_node)
    env[STACKS_ENV] = job.stacks_dir  # a hang is named with its workers' stacks
    if settings.start_method == "zygote":
        env.update(cluster.zygote_env())
    if job.net.mode == "netns":
        env.setdefault("GLOO_SOCKET_IFNAME", NODE_INTERFACE)  # not whatever the hostname says
    return env


def node_defaults(env: dict[str, str], nproc_per_node: int) -> None:
    """What every simulated node's environment has unless the user's ``env`` says otherwise,
    wherever the node runs:

    * one OpenMP thread per worker when a node runs several (two cores, many workers);
    * the workers behind their agent (``WORKER_NICE``): its keep-alive must not starve
      behind their imports or a ``slow_node`` quota, or a live node is taken for dead;
    * torch's ``TORCH_ELASTIC_WORKER_IDENTICAL``: every node of a cluster runs one role with
      the same number of workers, so each agent computes its workers' ranks from its group
      rank (torch's shortcut) instead of every agent publishing its role and waiting for
      group rank 0 to read all and answer: a barrier of every agent of the round, 0.4-0.6 s
      at 128 nodes. The ranks are the same either way."""
    if nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault(WORKER_NICE_ENV, str(WORKER_NICE))
    env.setdefault(WORKER_IDENTICAL_ENV, "1")


def fill_placeholders(arg: str, shared: str, node_disk: str, backend: Callable[[], str], scratch: str) -> str:
    """``arg`` with ``{shared}``, ``{node_disk}``, ``{tmp}`` (``scratch``) and ``{backend}``
    filled in: one rule for a node here and a node on a host (``harness.sim.places.hosts.nodes``), with that
    node's dirs. ``backend`` is asked for only where an arg names it (the cluster resolves
    its GPUs on first use)."""
    text = arg.replace("{shared}", shared).replace("{node_disk}", node_disk).replace("{tmp}", scratch)
    return text.replace("{backend}", backend()) if "{backend}" in text else text


def _command(job: StartingJob, index: int) -> tuple[Callable[..., Any] | str, list[Any]]:
    """What node ``index``'s agent runs: the callable, or ``python -u [-m] entrypoint``, with
    ``{shared}``, ``{node_disk}``, ``{tmp}`` and ``{backend}`` (the cluster's process-group
    backend) in the args filled in for this job and node."""
    def expand(arg: Any) -> Any:
        if not isinstance(arg, str):
            return arg
        return fill_placeholders(arg, job.shared_dir, job.storage.disk_of(index), lambda: job.cluster.backend,
                                 job.storage.scratch_dir)

    if callable(job.entrypoint):
        return job.entrypoint, [expand(a) for a in job.args]
    head = ["-u", "-m"] if job.module else ["-u"]
    return sys.executable, [*head, job.entrypoint, *(expand(str(a)) for a in job.args)]


def _free_slot(job: StartingJob) -> int:
    """The lowest node slot (GPU slice) no live node of ``job`` holds."""
    held = {n.slot for n in job.nodes.values() if n.alive()}
    slots = job.cluster.config.max_nodes
    free = [s for s in range(slots) if s not in held]
    return free[0] if free else len(job.nodes) % slots
