"""A job's nodes on hosts over SSH (``Cluster(hosts=[...])``; docs/hosts.md).

``RemoteNodes`` (``job.place`` of a cluster with hosts) is the glue between a job and ``harness.hosts``: it places
the nodes (``place``: round robin, or ``placement``), opens one ``SshHost`` per host the job
uses (the host's clock offset measured once it is open), and starts each node's agent
there as ``python -m harness.sim.nodes.main --json SPEC`` under the host's supervisor:

* **Spec.** Nothing that crosses the network is unpickled: the agent's spec is JSON (the
  ``LaunchConfig`` fields, the command's argv, its environment, the dirs to make), written
  0600 into the connection's work dir with ``SshHost.put`` (on the channel's stdin).
* **Secret.** The job's rendezvous secret goes the same way, into a 0600 file there named
  by ``HARNESS_RDZV_SECRET_FILE`` in the spec's environment: never on a command line, never
  in a log.
* **Store.** The store the harness runs listens on this machine. Each host reaches it
  through its own connection: a remote port forward on the host's loopback
  (``SshHost.forward_remote``) to a Unix socket here (``rendezvous_store.StoreBridge``),
  which relays to the store's TCP address. The agents rendezvous at ``127.0.0.1:PORT`` on
  their host. Only the SSH port must be open between this machine and a host; the store
  is never exposed on a network. With ``store_host="node0"`` node 0's agent hosts it, as
  torchrun's does, at its host's address and a port a keeper there holds for the job
  (``store_port``); the others reach it across the hosts' network (the job's secret
  keeps strangers out), and losing node 0 loses the store.
* **Script.** The node runs the job's script at its absolute path, which must be there on
  the host (a shared checkout), or, where the host's spec says ``copy_script``, its copy in
  the work dir (``script``).
* **Workers.** The node's ``local_addr`` is the host's address (its peers on other hosts
  reach its workers there; ``MASTER_ADDR`` is node 0's), gloo's interface the one that
  holds it. Workers start as the cluster's ``start_method`` says, a zygote being the
  agent's own (the warm pool is this machine's).
* **Events.** An ``EventRelay`` per node follows its events file on the host; each line,
  checked and moved onto our clocks, is appended to the job's events file (the bus and
  the timeline see it as a local node's). A node's exit is taken only once its relay has
  delivered the last line (``RemoteAgent.poll``), so its ``result`` event, from which its
  ``RunResult`` is read, precedes its ``node_exit``.
* **Faults.** Process faults are carried out on the host, through the agent's supervisor
  there: ``kill_agent`` and ``remove_node`` signal the agent's group (``signal N``),
  ``kill_node`` and ``freeze_node`` every process below it too (``tree N``), and
  ``freeze_node`` then waits for the supervisor to see the agent stopped (``stopped Q
  MS``); ``kill_worker`` and ``hang_worker`` signal the worker's pid of the host (its
  relayed ``worker_start``), which the supervisor signals only if it is a process below
  the agent (``pid Q PID N``: never a process the job did not start); a ``kill_worker``
  with ``exit_code``, and an exact (rank, step) crash, is an order left where the workers
  look (``orders``: the hosts' shared filesystem, or the one host's own dir). Triggers are this
  machine's, as for local nodes. Network faults are the host's nftables
  (``network``), resource faults its cgroups (``harness.sim.places.hosts.cgroups``:
  the agent's spec names them, ``job.resources.node_env``), where its ``capabilities``
  allow them. Faults a host cannot do (those its capabilities do not allow, faults on
  the shared filesystem; an exact (rank, step) exit order where the job's hosts share no
  filesystem) are refused when they are scheduled (``refuse``), in one line naming the
  host and what it lacks.
* **The end.** ``close()`` ends each node (on the host), its relay, then each connection:
  the work dir and everything started there go with it (``SshHost.close``).

``connector`` opens a host's connection: ``SshHost(spec)`` by default; a caller whose
``ssh`` must run otherwise (tests: inside a network namespace) sets its own.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from harness.agent import RunResult
from harness.errors import ProcessFailure
from harness.events import EVENTS_ENV, NODE_ENV, WAKE_ENV, EventWriter
from harness.hosts import ClockOffset, EventRelay, HostError, HostSpec, SshHost, measure_offset
from harness.procs import STACKS_ENV
from harness.rendezvous import SECRET_FILE_ENV
from harness.sim.errors import NetworkError
from harness.sim.nodes.gpus import VISIBLE_ENV
from harness.sim.nodes.main import SAME_PYTHON, WORKER_TMPDIR_ENV
from harness.sim.nodes.process import NodeProcess, job_secret_env
from harness.sim.nodes.rendezvous_store import StoreBridge, StoreSite
from harness.sim.nodes.scheduler import NodeScheduler, NoScheduler
from harness.sim.nodes.start import NODE_DISK_ENV, SHARED_DIR_ENV, fill_placeholders, launch_fields, node_defaults
from harness.sim.places.hosts.cgroups import HostCgroups
from harness.sim.places.hosts.disks import HostDisks
from harness.sim.places.hosts.network import HostNetwork
from harness.sim.places.hosts.orders import HostOrders
from harness.sim.places.hosts.port import HostPort
from harness.sim.places.hosts.refusals import placed_host, refuse_faults
from harness.sim.places.hosts.script import ScriptCopy
from harness.sim.places.hosts.shared import SharedDir, shared_base
from harness.sim.truth.progress import DIGEST_ENV, ORDERS_ENV
from harness.sim.truth.subject import Launched
from harness.sim.truth.timeline import HARNESS
from harness.states import WorkerState

if TYPE_CHECKING:
    from harness.hosts import RemoteProcess
    from harness.sim.bus import EventBus
    from harness.sim.faults import ScheduledFault
    from harness.sim.nodes.rendezvous_store import StoreHandle
    from harness.sim.nodes.start import NodesCluster
    from harness.sim.places.hosts.gpus import HostsGpuPlan
    from harness.sim.storage.mount import StorageMount
    from harness.sim.truth.timeline import Timeline

__all__ = ["HostWorkers", "RemoteAgent", "RemoteNodeProcess", "RemoteNodes", "connector", "run_result_from_json"]

_log = logging.getLogger(__name__)

#: what a job opens a host's connection with (replace it to run ``ssh`` otherwise)
connector: Callable[[HostSpec], SshHost] = SshHost

_RELAY_CLOSE_S = 10.0
#: how long a job's first round waits for more of its nodes once it has its minimum, on
#: hosts: a fresh agent there imports the harness before it joins (under load, seconds
#: apart from the others: with this machine's 1 s, a 1:2 job formed [1, 2, 1] under two busy
#: loops). It costs nothing when every node comes; only a first round short of max_nodes waits it
HOSTS_LAST_CALL_S = 5.0
#: how often each host's clock offset is measured again while the job runs (clocks drift:
#: NTP slews a host's wall clock, and two monotonic clocks run at their own crystals' rates)
CLOCK_UPKEEP_S = 120.0
#: a lost connection's lease ends at most this many times its ``lost_after`` after the loss
#: (``_remote``: three times the longest gap the controller showed, if longer), plus the margin
_GAPS_LOST, KEPT_MARGIN_S = 3.0, 10.0


# -- the events of a node on a host ------------------------------------------------------


# -- a node's agent on a host ------------------------------------------------------------


def _as_popen_code(code: int) -> int:
    """The supervisor's status (128+N: signal N) as ``Popen.returncode`` says it (-N)."""
    return -(code - 128) if 128 < code < 128 + 65 else code


class RemoteAgent:
    """A node's agent on a host, as the job holds a local agent's ``Popen``: ``pid`` is
    the local ssh client's (the bus watches it), ``poll()`` says the agent's status once
    it ended *and* its relay delivered every line it wrote. ``host`` is the connection it
    runs over."""

    def __init__(self, proc: RemoteProcess, relay: EventRelay, host: SshHost):
        self.proc, self.relay, self.host = proc, relay, host
        self._lock = threading.Lock()
        self._drained = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        self._drain()
        return _as_popen_code(code)

    def wait(self, timeout: float | None = None) -> int:
        """Like ``Popen.wait`` (``subprocess.TimeoutExpired`` past ``timeout``)."""
        self.proc.popen.wait(timeout)
        code = self.poll()
        assert code is not None
        return code

    def _drain(self) -> None:
        """The relay's last lines in (once): the host side forwards what the file holds."""
        with self._lock:
            if self._drained:
                return
            self._drained = True
            try:
                self.relay.close(_RELAY_CLOSE_S)
            except HostError as e:
                _log.warning("%s", e)

    def signal_group(self, sig: int) -> None:
        """``sig`` to the agent's process group on the host (its workers lead their own)."""
        self.proc.send_signal(sig)

    def signal_tree(self, sig: int) -> None:
        """``sig`` to the agent and every process below it on the host."""
        self.proc.signal_tree(sig)

    def signal_below(self, pid: int, sig: int) -> bool:
        """``sig`` to ``pid`` of the host only if it is a process below the agent (checked
        and signalled there, by its supervisor); False: no such process now; ``HostError``:
        any other process, not signalled."""
        return self.proc.signal_pid(pid, sig)

    def await_stopped(self, timeout: float) -> str:
        """Until the agent is stopped or ended, at most ``timeout`` s (its supervisor
        waits, on the host): ``"stopped"``, ``"exited"`` or ``"running"``."""
        return self.proc.await_stopped(timeout)

    def close(self) -> None:
        """End it on the host (SIGTERM, grace, SIGKILL), reap the client, close the relay."""
        self.proc.close()
        self._drain()

    def __repr__(self) -> str:
        return f"<RemoteAgent {self.proc!r}>"


#: on the host, for each pid: "PID STATE" (its /proc state letter), nothing for one gone (the
#: command name in /proc/PID/stat may hold spaces and parentheses: the state follows the last ") ")
_STATES_SH = ('for p; do s=$(sed "s/.*) //" "/proc/$p/stat" 2>/dev/null | cut -d" " -f1) && [ -n "$s" ] '
              '&& echo "$p $s"; done; true')
#: on the host, for each path: "SIZE PATH", nothing for one missing
_SIZES_SH = 'for f; do s=$(stat -c %s "$f" 2>/dev/null) && echo "$s $f"; done; true'


class HostWorkers:
    """A node's workers on its host, as ``harness.sim.truth.stacks.WorkerAccess``: their states
    and stack dumps (``{node dir}/stacks/PID.txt`` there) read over the node's connection,
    their signals sent by the agent's supervisor, which signals only a process below the
    agent. A host that does not answer is a warning and no workers, never a hang's report lost."""

    def __init__(self, node: RemoteNodeProcess):
        self.node = node

    def _run(self, argv: list[str]) -> str:
        try:
            return self.node.agent.host.run(argv, check=False).stdout
        except HostError as e:
            _log.warning("node %d: its workers' stacks: %s", self.node.index, e)
            return ""

    def states(self, pids: Sequence[int]) -> dict[int, str]:
        from harness.sim.truth.stacks import STATES

        states = {}
        for line in self._run(["sh", "-c", _STATES_SH, "sh", *map(str, pids)]).splitlines():
            pid, _, letter = line.partition(" ")
            if pid.isdigit() and letter:
                states[int(pid)] = STATES.get(letter, letter)
        return states

    def dump_file(self, pid: int) -> str | None:
        return f"{self.node.remote_directory}/stacks/{pid}.txt"

    def sizes(self, paths: Sequence[str]) -> dict[str, int]:
        sizes = {}
        for line in self._run(["sh", "-c", _SIZES_SH, "sh", *paths]).splitlines():
            size, _, path = line.partition(" ")
            if size.isdigit() and path in paths:
                sizes[path] = int(size)
        return sizes

    def signal(self, pid: int, sig: int) -> bool:
        try:
            return self.node.agent.signal_below(pid, sig)
        except HostError as e:
            _log.warning("node %d: %s", self.node.index, e)
            return False

    def read(self, path: str, offset: int) -> str:
        return self._run(["tail", "-c", f"+{offset + 1}", path])


def run_result_from_json(data: Any) -> RunResult | None:
    """A ``RunResult`` from its JSON (``RunResult.to_json``, the agent's ``result`` event);
    None when it is not one. Failures keep their message and time; their error files are
    the host's (not readable here)."""
    try:
        state = WorkerState(data["state"])
        values = {int(rank): value for rank, value in data.get("return_values", {}).items()}
        failures = {}
        for rank, item in data.get("failures", {}).items():
            failure = ProcessFailure(local_rank=int(item["local_rank"]), pid=int(item["pid"]),
                                     exitcode=int(item["exitcode"]), error_file="")
            failure.message = str(item.get("message", failure.message))
            failure.timestamp_ns = int(item.get("timestamp_ns", failure.timestamp_ns))
            failure.timestamp = failure.timestamp_ns // 1_000_000_000
            failures[int(rank)] = failure
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return RunResult(state, values, failures)


@dataclass
class RemoteNodeProcess(NodeProcess):
    """A node whose agent runs on a host (``popen`` is its ``RemoteAgent``; ``directory``
    is its local dir, holding ``agent.log``: the agent's stdout and stderr)."""

    host: str = ""  # the host's label
    remote_directory: str = ""  # the node's dir on the host
    timeline: Timeline | None = None  # the job's: the node's relayed events are there

    @property
    def agent(self) -> RemoteAgent:
        assert isinstance(self.popen, RemoteAgent)
        return self.popen

    def placed(self) -> dict[str, str]:
        return {"host": self.host}

    def result(self) -> RunResult | None:
        """From the agent's ``result`` event (relayed before its exit is taken)."""
        data = self.timeline.results().get(self.index) if self.timeline is not None else None
        return None if data is None else run_result_from_json(data)

    def live_workers(self, starts: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
        """local_rank -> pid, on the host, of the workers of ``starts`` not reported gone
        (a ``worker_exit`` of that pid) while the agent runs: the host's processes cannot
        be asked from here."""
        if not self.alive() or self.timeline is None:
            return {}
        gone = {(e.get("local_rank"), e.get("worker_pid")) for e in self.timeline.events("worker_exit", self.index)}
        return {rank: s["worker_pid"] for rank, s in starts.items() if (rank, s["worker_pid"]) not in gone}

    def worker_access(self) -> HostWorkers:
        """Its workers as ``harness.sim.truth.stacks`` reaches them: on the host."""
        return HostWorkers(self)

    def signal_agent(self, sig: int) -> None:
        """``sig`` to the agent's group on the host (not the workers below it, which lead
        groups of their own and must follow on their own)."""
        self.agent.signal_group(sig)

    def signal_node(self, sig: int, worker_pids: Iterable[int] = ()) -> None:
        """``sig`` on the host to the agent and every process below it (its supervisor
        finds them there: the relayed pids are not needed)."""
        self.agent.signal_tree(sig)

    def kill_workers(self, starts: Iterable[Mapping[str, Any]]) -> list[int]:
        """Nothing here: its workers are the host's processes, killed with the agent's tree
        (``signal_node``) and reaped there."""
        return []

    def signal_worker(self, pid: int, sig: int) -> None:
        """``sig`` to worker ``pid`` on the host, by the agent's supervisor there, which
        signals it only if it is a process below the agent (``HostError`` otherwise:
        nothing signalled); nothing if it just ended. A pid of the host is never signalled
        from here (here it names another process, or none)."""
        self.agent.signal_below(pid, sig)

    def await_stopped(self, timeout: float) -> None:
        """Until the agent (just SIGSTOPped on the host) is stopped or gone, at most
        ``timeout`` s: its supervisor there says when (``stopped Q MS``)."""
        try:
            state = self.agent.await_stopped(timeout)
        except HostError as e:
            _log.warning("node %d: %s", self.index, e)
            return
        if state == "running":
            _log.warning("node %d: its agent on host %s was sent SIGSTOP but is still running after %g s",
                         self.index, self.host, timeout)


# -- the job's hosts ---------------------------------------------------------------------


@dataclass
class _Link:
    """One host's connection for one job: its clock offset and the store's port there
    (None: the job has no store of the harness's, its one node hosts its own)."""

    host: SshHost
    offset: ClockOffset
    store_port: int | None


class PlacedJob(Launched, Protocol):
    """The job as its hosts' placement sees it: what it runs (``Launched``), its directory,
    event file and bus, its cluster, its store, its nodes, timeline and cgroups."""

    @property
    def directory(self) -> str: ...

    @property
    def events_path(self) -> str: ...

    @property
    def bus(self) -> EventBus: ...

    @property
    def cluster(self) -> NodesCluster: ...

    @property
    def store(self) -> StoreHandle | None: ...

    @property
    def nodes(self) -> Mapping[int, NodeProcess]: ...

    @property
    def timeline(self) -> Timeline: ...

    @property
    def resources(self) -> NodeEnv: ...

    @property
    def net(self) -> StoreNet: ...


class StoreNet(Protocol):
    """The job's own network as its hosts see it: where the harness's store listens here."""

    @property
    def store_address(self) -> str: ...


class NodeEnv(Protocol):
    """The job's resource part as a node's start on a host sees it (``ResourceFaults``)."""

    def node_env(self, node: int) -> dict[str, str]: ...

    def socket_cgroup(self, node: int) -> tuple[str, int] | str: ...


class RemoteNodes:
    """A job's hosts and the nodes it places on them (``job.place``: a
    ``harness.sim.places.seam.JobPlace``)."""

    #: a node's handle (a place whose nodes are signalled another way gives its own)
    node_type: type[RemoteNodeProcess] = RemoteNodeProcess

    def __init__(self, job: PlacedJob, gpus: HostsGpuPlan, hosts: Sequence[HostSpec],
                 placement: Sequence[int] | None, connect: Callable[[HostSpec], SshHost] | None = None,
                 store: StoreSite | None = None):
        self._job = job
        self._gpus = gpus  # the hosts' GPUs, split between the node slots placed on each
        self.hosts: tuple[HostSpec, ...] = tuple(hosts)
        self.placement = tuple(placement) if placement is not None else None
        #: opens a host's channel (None: ``connector``, read when a host is opened: tests replace it)
        self._connect = connect
        #: where the harness's store listens, reached by the hosts directly (None: on this
        #: machine's loopback, forwarded to each host over its connection)
        self._store = store
        self._links: dict[HostSpec, _Link] = {}
        self._started: set[int] = set()  # the nodes started on their hosts (their cgroups made there)
        self._lost: dict[HostSpec, SshHost] = {}  # a host's connection lost, until what it missed is read
        self._bridge: StoreBridge | None = None
        self._sink: EventWriter | None = None
        self._lock = threading.Lock()
        #: the network faults of the job's nodes, carried out by their hosts
        self.network = HostNetwork(self)
        base = shared_base(self.hosts)
        #: the job's ``{shared}`` where its hosts share a filesystem (None: each host's own dir)
        self.shared = SharedDir(base, job.run_id) if base is not None else None
        #: where the job's exit-code orders are left for its workers there
        self.orders = HostOrders(self, self.shared)
        #: the nodes' cgroups, each on its node's host (a keeper there per node)
        self.cgroups = HostCgroups(self, lambda: job.run_id)
        #: the scheduler that owns the nodes: none on SSH hosts
        self.scheduler: NodeScheduler = NoScheduler(
            "runs on an SSH host, which no scheduler owns: the scheduler's own faults need the nodes in a Slurm "
            "allocation (--elastic-slurm)")
        self._disks: HostDisks | None = None  # the nodes' disks there (``disk_servers``, with the job's storage)
        self._script: ScriptCopy | None = None  # the job's script, for hosts that copy it
        self._ended = threading.Event()  # the job's hosts are closed: the clock upkeep stops
        self._upkeep: threading.Thread | None = None

    def host_of(self, node: int) -> HostSpec:
        """Node ``node``'s host (``placed_host``)."""
        return placed_host(self.hosts, self.placement, node)

    def address(self, node: int) -> str:
        """Node ``node``'s address: its host's."""
        return self.host_of(node).address

    def connection(self, node: int) -> tuple[SshHost, int | None]:
        """Node ``node``'s host's connection and the store's port there (``NodeLinks``):
        open once the node started."""
        with self._lock:
            link = self._links.get(self.host_of(node))
        if link is None:
            raise NetworkError(f"node {node} has not started on its host {self.host_of(node).label}")
        return link.host, link.store_port

    def opened(self, spec: HostSpec | None) -> SshHost | None:
        """``spec``'s open connection (None: any open one), or None (``HostOrders``)."""
        links = list(self._links.items())
        return next((link.host for each, link in links if spec in (None, each)), None)

    def reconnect(self, node: int) -> SshHost:
        """A new connection to node ``node``'s host in place of one that was lost (the
        store forwarded there again, the clock offset measured again); the old one closed.
        The nodes that ran over the old one are lost with it: their agents' clients ended."""
        spec = self.host_of(node)
        with self._lock:
            old = self._links.pop(spec, None)
            if old is not None:
                self._lost[spec] = old.host
        if old is not None:
            old.host.close()
        return self._link(spec, None).host  # the store's bridge, if the job has one, is forwarded again

    def deliver_missed(self, node: int) -> dict[int, int | None]:
        """For each node that ran on node ``node``'s host over the connection ``reconnect``
        replaced: how many lines of its events file there its relay never brought, now read
        over the new connection and delivered to the timeline (None: the host no longer had
        them). They are read once the old lease has ended what it ran there (the files are
        whole), which it does at once where its sshd hears the reset, else after its
        ``lost_after``; it keeps them for ``keep_missed`` s (``SshHost``), then lets go."""
        spec = self.host_of(node)
        with self._lock:
            link, old = self._links.get(spec), self._lost.pop(spec, None)
        if link is None or old is None or old.info is None:
            return {}
        lost = [(index, handle.agent.relay) for index, handle in self._job.nodes.items()
                if isinstance(handle, RemoteNodeProcess) and handle.agent.host is old]
        host, work_dir = link.host, old.info.work_dir
        try:
            state = host.kept(work_dir, _GAPS_LOST * (old.lost_after or 0) + KEPT_MARGIN_S)
            counts = {index: relay.catch_up(host) if state == "kept" else None for index, relay in lost}
            if state == "kept":
                host.release(work_dir)
        except HostError as e:  # the job ended meanwhile, or the host went again
            _log.warning("host %s: what its lost connection missed could not be read: %s", spec.label, e)
            return {index: None for index, _ in lost}
        return counts

    def disk_servers(self, mount: StorageMount, answer: Callable[[str, dict[str, Any]], Any]) -> HostDisks:
        """The nodes' disks, each served on its node's host where it lists ``fuse`` (the
        job's own ``mount`` serves none of them)."""
        self._disks = HostDisks(self, lambda: self._job.run_id, answer)
        return self._disks

    def store_site(self) -> StoreSite:
        """Where the harness's store listens: the place's (reached directly), else on this
        machine's loopback (each host's connection forwards it there)."""
        return self._store or StoreSite(self._job.net.store_address, 0, None)

    def store_port(self, node: int) -> tuple[HostPort, str]:
        """A port on node ``node``'s host, at its address, kept for the job (a keeper there
        holds it bound, not listening: the store node ``node``'s agent hosts binds it too,
        with SO_REUSEADDR, as ``PortReservation`` keeps one here); the keeper and the
        endpoint. The host's connection is opened for it (no store forwarded over it)."""
        spec = self.host_of(node)
        kept = HostPort(self._link(spec, None).host, f"for the store node {node} hosts")
        return kept, f"{spec.address}:{kept.port}"

    def node_count(self) -> int:
        """The node indices the job can have: its ``max_nodes``, and any added past it."""
        return max(self._job.cluster.config.max_nodes, len(self._job.nodes))

    def neighbours(self, node: int) -> list[int]:
        """The job's other node indices placed on node ``node``'s host (``NodeLinks``)."""
        spec = self.host_of(node)
        return [n for n in range(max(self.node_count(), node + 1)) if n != node and self.host_of(n) == spec]

    def sockets(self, node: int) -> tuple[str, int] | str:
        """Node ``node``'s cgroup v2 dir as its host's nft names it, or why it has none
        (``NodeLinks``): its cgroup there is made as it starts (``node_env``)."""
        if node not in self._started:
            return f"node {node} to have started on its host {self.host_of(node).label}"
        return self._job.resources.socket_cgroup(node)

    def _link(self, spec: HostSpec, store_endpoint: str | None) -> _Link:
        """The job's connection to ``spec`` (opened on first use), the store forwarded there."""
        with self._lock:
            link = self._links.get(spec)
            if link is not None:
                return link
            if self._bridge is None and store_endpoint is not None:
                self._bridge = StoreBridge(store_endpoint)
            host = (self._connect or connector)(spec)
            try:
                host.open()
                port = host.forward_remote(self._bridge.path) if self._bridge is not None else None
                link = _Link(host, measure_offset(host), port)
            except BaseException:
                host.close()
                raise
            self._links[spec] = link
            if self.shared is not None and not self.shared.swept:  # a killed controller's leftovers
                self.shared.sweep(host)
            if self._upkeep is None:
                self._upkeep = threading.Thread(target=self._keep_clocks, name="clock upkeep", daemon=True)
                self._upkeep.start()
            return link

    def _keep_clocks(self) -> None:
        """Every ``CLOCK_UPKEEP_S``: each host's offset measured again, handed to the relays
        of its nodes (their next line uses it), and recorded (``clock_offset``: the host,
        how far the offset moved since the last measurement, and its error bound). A host
        that does not answer keeps its last offset (a warning; a fault may be cutting it off)."""
        while not self._ended.wait(CLOCK_UPKEEP_S):
            with self._lock:
                links = list(self._links.items())
            for spec, link in links:
                try:
                    offset = measure_offset(link.host, timeout=2.0)
                except HostError as e:
                    _log.warning("host %s: its clock offset not measured again: %s", spec.label, e)
                    continue
                moved = offset.mono_offset_s - link.offset.mono_offset_s
                link.offset = offset
                for node in list(self._job.nodes.values()):
                    if isinstance(node, RemoteNodeProcess) and node.agent.host is link.host:
                        node.agent.relay.offset = offset
                self._events().emit("clock_offset", host=spec.label, moved_s=round(moved, 6),
                                    mono_offset_s=offset.mono_offset_s, error_bound_s=offset.error_bound_s)

    def _events(self) -> EventWriter:
        if self._sink is None:  # the job's events file, as a local node's agent appends to it
            self._sink = EventWriter(self._job.events_path, HARNESS, wake=self._job.bus.wake_path)
        return self._sink

    def start(self, index: int, rdzv: Mapping[str, Any]) -> RemoteNodeProcess:
        """Start node ``index``'s agent on its host; its handle, not yet in ``job.nodes``."""
        job = self._job
        spec = self.host_of(index)
        here = job.store is not None and job.store.node is None  # the harness's store (not node 0's)
        forwarded = here and self._store is None  # else the hosts reach it where it listens
        link = self._link(spec, rdzv["endpoint"] if forwarded else None)
        host = link.host
        name = job.cluster.new_node_label(index)
        directory = os.path.join(job.directory, f"node{index}")
        os.makedirs(directory)
        there = f"{host.work_dir}/node{index}"
        relay = EventRelay(host, f"{there}/events.jsonl", self._events().write, offset=link.offset, node=index)
        held = {n.slot for n in job.nodes.values() if n.alive()}
        slot, gpus = self._gpus.for_node(index, spec, held)  # the host's own GPUs (``gpus``)
        try:
            proc = self._start_agent(index, name, spec, link, there, relay, rdzv, directory, gpus)
        except BaseException:
            relay.close()
            raise
        agent = RemoteAgent(proc, relay, host)
        self._started.add(index)
        self.network.node_started(index)  # a table of its host's tags its loopback packets from now
        return self.node_type(index, name, spec.address, directory, agent, "", slot=slot, gpus=gpus,
                                 host=spec.label, remote_directory=there, timeline=job.timeline)

    def _start_agent(self, index: int, name: str, spec: HostSpec, link: _Link, there: str, relay: EventRelay,
                     rdzv: Mapping[str, Any], directory: str, gpus: tuple[str, ...]) -> RemoteProcess:
        job = self._job
        settings = job.cluster.config
        host = link.host
        with open(job_secret_env(job.directory)[SECRET_FILE_ENV], "rb") as fp:
            secret = host.put(f"node{index}/rdzv.secret", fp.read())
        config = launch_fields(settings, job.run_id, index, rdzv, name, spec.address,
                               rdzv["endpoint"] if link.store_port is None else f"127.0.0.1:{link.store_port}",
                               last_call=HOSTS_LAST_CALL_S, launched=job.launched_nodes)
        # the node's {shared}: its view of the job's shared dir, served by its disk's server where it has one
        assert self._disks is not None, "the job's storage part asks for its servers as the job is made"
        disk, worker_tmp, shared = self._disks.serve(
            index, there, self.shared.path if self.shared is not None else f"{host.work_dir}/shared")
        env = {**settings.env, EVENTS_ENV: f"{there}/events.jsonl", NODE_ENV: str(index),
               WAKE_ENV: relay.wake_path, ORDERS_ENV: self.orders.dir_on(host), "TMPDIR": f"{there}/tmp",
               SHARED_DIR_ENV: shared, NODE_DISK_ENV: disk, WORKER_TMPDIR_ENV: worker_tmp,
               STACKS_ENV: f"{there}/stacks", SECRET_FILE_ENV: secret, **job.resources.node_env(index)}
        if gpus:
            env[VISIBLE_ENV] = ",".join(gpus)
        if settings.golden:
            env[DIGEST_ENV] = "1"
        node_defaults(env, settings.nproc_per_node)

        entry = job.entrypoint
        assert isinstance(entry, str)  # launch refuses a callable with hosts
        if job.module:
            head = ["-u", "-m", entry]
        elif spec.copy_script:  # its copy there (``script``)
            if self._script is None:
                self._script = ScriptCopy(entry)
            head = ["-u", self._script.on(host)]
        else:
            head = ["-u", os.path.abspath(entry)]
        # {tmp}: the job's dir every node sees (the shared filesystem's, beside {shared}; else the host's own)
        scratch = self.shared.scratch if self.shared is not None else f"{host.work_dir}/scratch"
        args = [fill_placeholders(str(arg), shared, disk, lambda: job.cluster.backend, scratch) for arg in job.args]
        node_spec = {"config": config, "entrypoint": SAME_PYTHON, "args": [*head, *args],
                     "env": env, "dirs": [f"{there}/tmp", disk, worker_tmp, f"{there}/stacks",
                                          self.orders.dir_on(host), shared, scratch],
                     "result_path": f"{there}/result.json"}
        spec_path = host.put(f"node{index}/spec.json", json.dumps(node_spec).encode())
        with open(os.path.join(directory, "agent.log"), "wb") as log:
            return host.start([spec.python, "-m", "harness.sim.nodes.main", "--json", spec_path],
                              stdout=log.fileno(), stderr=log.fileno())

    # -- faults ----------------------------------------------------------------------

    def refuse(self, entries: Sequence[ScheduledFault]) -> None:
        """``FaultRefused`` for the first entry whose node's host cannot carry it out."""
        refuse_faults(entries, self.hosts, self.placement, self.node_count())

    def guarded(self, kind: str, act: Callable[..., Any]) -> Callable[..., Any]:
        """``act`` (the part's method of fault ``kind``, as ``job.<kind>`` calls it), refused
        first as a scheduled fault of the same fields would be (``refuse``)."""
        from harness.sim.faults import Immediately, ScheduledFault, fault_class

        @functools.wraps(act)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                fault = fault_class(kind)(*args, **kwargs)
            except (TypeError, ValueError):  # not the row's fields: the part's own error says why
                return act(*args, **kwargs)
            self.refuse([ScheduledFault(fault, Immediately())])
            return act(*args, **kwargs)

        return call

    # -- the end ---------------------------------------------------------------------

    def _remove_shared(self, shared: SharedDir) -> list[str]:
        """The job's shared dir removed over a host's connection that still works: a
        host lost meanwhile (its Slurm node DOWN, its network cut) cannot, another one
        can (every host mounts it); the first problem if none could."""
        said: list[str] = []
        hosts = sorted((link.host for link in self._links.values()), key=lambda host: not host.connected())
        for host in hosts:
            problem = shared.remove(host)
            if problem is None:
                return []
            said.append(problem)
        return said[:1]

    def close(self) -> list[str]:
        """Every node's agent and relay, then every connection (what each started on its
        host goes, its work dir last), the bridge, the sink; what could not be ended."""
        problems = []
        self._ended.set()
        if self.shared is not None and self._links:  # its nodes ended: nothing writes there now
            problems += self._remove_shared(self.shared)
        for link in self._links.values():
            try:
                link.host.close()
            except (HostError, OSError, subprocess.SubprocessError) as e:
                problems.append(f"host {link.host.spec.label}: {e}")
        self._links.clear()
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        return problems

