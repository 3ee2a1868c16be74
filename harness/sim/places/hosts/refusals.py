"""Where a job's nodes on hosts run, and the faults their hosts cannot carry out.

A fault on a node placed on a host is refused before anything is recorded (``FaultRefused``,
one line naming the host and what it lacks) where the host cannot carry it out: a
capability its hosts file does not list, a kind not done on hosts, a fault on the hosts'
shared filesystem where they share none, an exact (rank, step) exit order where the
workers could not find it, and a network fault that would fall on nodes it does not name.
The same checks run for a job's own faults (``RemoteNodes.refuse``), for a scenario's
before it starts (the plugin skips it, saying why), and for the kinds chaos draws there.

Why a module of its own: these are pure functions of the hosts file and the placement
(nothing is connected to ask them), shared by the job, the plugin and the tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from harness.hosts import HostSpec, place, refusal
from harness.sim.errors import FaultRefused
from harness.sim.places.hosts.network import NOT_ON_HOSTS
from harness.sim.places.hosts.orders import exact_order_refusal
from harness.sim.places.hosts.shared import shared_fs_refusal
from harness.sim.schema import CGROUPS, SLURMD

if TYPE_CHECKING:
    from harness.sim.faults import ScheduledFault

__all__ = ["BY_SOCKETS", "HOST_FAULTS", "NETWORK_CHAOS_ON_HOSTS", "NOT_ON_SLURM", "by_sockets", "chaos_kinds",
           "host_refusal", "placed_host", "placed_hosts", "refuse_faults", "shared_host_refusal"]

#: the faults carried out on a host (network ones where its capabilities say netns); every other kind is refused there
HOST_FAULTS = ("kill_worker", "hang_worker", "kill_agent", "kill_node", "remove_node", "add_node", "freeze_node",
               "kill_store_host", "heal", "partition", "packet_loss", "bandwidth", "host_unreachable",
               "slow_node", "memory_limit", "disk_full", "slow_io", "io_error")
#: the network faults that fall on one node of several on a host (by its sockets), where it lists cgroups
BY_SOCKETS = ("partition", "packet_loss")
#: the faults of SSH hosts not done on a Slurm allocation's nodes, and why
NOT_ON_SLURM = {
    "host_unreachable": "it cuts the harness's SSH connection to a host, and a Slurm node is reached by srun's "
                        "job steps (down_node and kill_slurmd lose a node the scheduler's way)",
}
#: where chaos draws network faults on hosts (``chaos_kinds``: a job's own are refused per node)
NETWORK_CHAOS_ON_HOSTS = ("network kinds where each of a job's nodes is alone on its host, which no other job "
                          f"shares, or its host lists '{CGROUPS}'")


def placed_host(hosts: Sequence[HostSpec], placement: Sequence[int] | None, node: int) -> HostSpec:
    """Node ``node``'s host: ``placement`` for the nodes it names, round robin past them."""
    if placement is not None and node < len(placement):
        return hosts[placement[node]]
    placed = place(node + 1, hosts)[node]
    assert placed is not None
    return placed


def placed_hosts(hosts: Sequence[HostSpec], placement: Sequence[int] | None, count: int) -> list[HostSpec]:
    """The hosts of nodes 0..``count``-1 (``placed_host`` each): where a job's nodes may be."""
    return [placed_host(hosts, placement, node) for node in range(count)]


def host_refusal(host: HostSpec, kind: str, needs: Iterable[str] = ()) -> str | None:
    """Why ``host`` cannot carry out a fault of ``kind`` that needs ``needs`` (one line),
    or None: it is the scheduler's own and no scheduler owns the host (an SSH host), it
    lacks a capability (``refusal``), the kind is not done on hosts (``NOT_ON_HOSTS``) or on
    a Slurm node (``NOT_ON_SLURM``), or
    it is not among the kinds hosts carry out (``HOST_FAULTS``)."""
    from harness.sim.schema import FAULT_KINDS

    row = FAULT_KINDS.get(kind)
    if row is not None and row.slurm_only:
        if host.scheduler != "slurm":
            return (f"{kind} needs the nodes in a Slurm allocation (--elastic-slurm): it is the scheduler's own "
                    "fault, and an SSH host has no scheduler")
        if SLURMD in needs and SLURMD not in host.capabilities:
            return (f"node {host.label} cannot do it: {kind} needs slurmd_kill and slurmd_start in the Slurm file "
                    "(the commands that kill and start a node's slurmd: an operator's)")
        return refusal(host, needs)
    why = refusal(host, needs)
    if why is None and host.scheduler == "slurm" and kind in NOT_ON_SLURM:
        why = f"{kind} is not done on Slurm nodes: {NOT_ON_SLURM[kind]}"
    elif why is None and kind in NOT_ON_HOSTS:
        why = f"{kind} is not done on hosts: {NOT_ON_HOSTS[kind]}"
    elif why is None and kind not in HOST_FAULTS:
        why = f"host {host.label} cannot do it: {kind} is not carried out on hosts"
    return why


def by_sockets(host: HostSpec, kind: str) -> bool:
    """Whether a network fault of ``kind`` on a node of ``host`` falls on that node's
    sockets alone (``rules.NodeSockets``), and not on everything the host carries."""
    return kind in BY_SOCKETS and CGROUPS in host.capabilities


def shared_host_refusal(host: HostSpec, kind: str) -> str | None:
    """Why a network fault of ``kind`` on a node of ``host``, a host that is not the job's
    alone (``exclusive`` false), would fall on the other jobs' nodes there too; None where
    it is the job's alone, or the fault falls on the node's sockets alone."""
    if host.exclusive or by_sockets(host, kind):
        return None
    return (f"host {host.label} is not the job's alone (exclusive = false: other jobs run there too, as under "
            f"pytest -n), and a {kind} there falls on their nodes too: "
            + (f"it needs '{CGROUPS}' in that host's capabilities, by which nft tells the node's sockets apart"
               if kind in BY_SOCKETS else "run it where no other job does"))


def _sharing(hosts: Sequence[HostSpec], placement: Sequence[int] | None, nnodes: int, node: int, kind: str,
             peers: object) -> str | None:
    """Why a network fault of ``kind`` on ``node`` (cut from ``peers``) would fall on nodes
    it does not name, of this job or of another one on a host that is not this job's alone
    (``exclusive``), or None. A host's rules match by address, and so fall on every node
    it carries, but those of a partition or packet loss where the host lets the harness
    make cgroups: they match the faulted node's own sockets (``rules.NodeSockets``).
    A peer is matched by its host's address, unless it shares the faulted node's host
    (then by its sockets)."""
    named = ({p for p in peers if isinstance(p, int) and not isinstance(p, bool) and p >= 0}
             if isinstance(peers, (list, tuple)) else set())  # a bad peer is the part's to name
    where = placed_hosts(hosts, placement, max(nnodes, node + 1, *(p + 1 for p in named)))
    on: dict[HostSpec, list[int]] = {}
    for n, host in enumerate(where):
        on.setdefault(host, []).append(n)
    own = where[node]
    why = shared_host_refusal(own, kind)
    if why is not None:
        return why
    if len(on[own]) > 1:
        carried = f"host {own.label} carries nodes {', '.join(map(str, on[own]))} of this job"
        if kind not in BY_SOCKETS:
            return (f"{carried}, and a {kind} there falls on every node it carries: place node {node} alone on "
                    "a host (placement=)")
        if CGROUPS not in own.capabilities:
            return (f"{carried}, and a {kind} of one of them alone needs '{CGROUPS}' in that host's capabilities "
                    f"(each node's own cgroup there, by which nft tells their sockets apart), or node {node} "
                    "alone on a host (placement=)")
    for peer in sorted(named):
        if where[peer] == own:
            continue  # cut on the faulted node's host, by its sockets
        others = [n for n in on[where[peer]] if n not in named]
        if others:
            return (f"peer node {peer}'s host {where[peer].label} also carries node(s) "
                    f"{', '.join(map(str, others))}, which a cut from it would cut too: name them in peers, "
                    f"or place node {peer} alone on a host (placement=)")
    return None


def chaos_kinds(kinds: Sequence[str], hosts: Sequence[HostSpec], placement: Sequence[int] | None,
                max_nodes: int) -> tuple[tuple[str, ...], dict[str, str]]:
    """The chaos kinds of ``kinds`` a job on ``hosts`` (placed by ``placement``, at most
    ``max_nodes`` nodes: chaos adds none past it) draws, and those it leaves out, with why:
    a kind a host cannot carry out (``host_refusal``: a capability it lacks, the scheduler's
    own on an SSH host), a network kind where a host would carry two of its nodes, or is not
    the job's alone (``exclusive``), and could not tell their sockets apart (the fault would
    fall on both, and its refusal would fail the schedule). The session's kinds are the
    hosts' already (``pytest_elastic``'s ``chaos_kinds_on_hosts``); this is the job's cut of
    them."""
    from harness.sim.schema import CHAOS_KINDS

    where = placed_hosts(hosts, placement, max_nodes)
    left_out: dict[str, str] = {}
    for kind in kinds:
        refused = next((why for spec in dict.fromkeys(where)
                        if (why := host_refusal(spec, kind, CHAOS_KINDS[kind].needs))), None)
        if refused is not None:
            left_out[kind] = refused
        if refused is not None or CHAOS_KINDS[kind].part != "network":
            continue
        crowded = next((spec for spec in dict.fromkeys(where) if where.count(spec) > 1 and not by_sockets(spec, kind)),
                       None)
        shared = next((why for spec in dict.fromkeys(where) if (why := shared_host_refusal(spec, kind))), None)
        if crowded is not None:
            left_out[kind] = (f"host {crowded.label} would carry {where.count(crowded)} of this job's nodes, and a "
                              f"network fault there falls on each ({NETWORK_CHAOS_ON_HOSTS})")
        elif shared is not None:
            left_out[kind] = shared
    return tuple(kind for kind in kinds if kind not in left_out), left_out


def refuse_faults(entries: Sequence[ScheduledFault], hosts: Sequence[HostSpec],
                  placement: Sequence[int] | None, nnodes: int = 0) -> None:
    """``FaultRefused`` for the first entry whose node's host (of ``hosts``, placed by
    ``placement``) cannot carry it out; a job's (``RemoteNodes.refuse``) and a scenario's
    before it starts (the plugin skips it, saying why). ``nnodes``: how many nodes the
    job can have (a network fault on a node that shares its host is refused)."""
    from harness.sim.faults import AtStep, OnFile
    from harness.sim.schema import FAULT_KINDS

    spread = placed_hosts(hosts, placement, max(nnodes, 1))
    for entry in entries:
        fault = entry.fault
        if getattr(fault, "exit_code", None) is not None and isinstance(entry.trigger, AtStep):
            exact = exact_order_refusal(hosts, spread)
            if exact is not None:
                raise FaultRefused(entry.describe(), f"the job's nodes are on hosts, and {exact}")
        row = FAULT_KINDS.get(fault.kind)
        needs = set(row.needs if row is not None else ())
        node = getattr(fault, "node", None)
        shared_fs = (getattr(fault, "lose_unsynced", False) or getattr(fault, "torn", False) or
                     isinstance(entry.trigger, OnFile) or (not isinstance(node, int) and row is not None and
                                                           row.part == "storage"))
        if shared_fs:
            why = shared_fs_refusal(hosts, spread)
            if why is not None:
                raise FaultRefused(entry.describe(), f"the job's nodes are on hosts, and {why}")
        if not isinstance(node, int):
            if not shared_fs and (needs or fault.kind not in HOST_FAULTS):
                raise FaultRefused(entry.describe(), "the job's nodes are on hosts, and it needs "
                                   f"{', '.join(sorted(needs)) or 'the nodes on this machine'} on every node's "
                                   "host: name a node (node=...)")
            continue
        why = host_refusal(placed_host(hosts, placement, node), fault.kind, needs)
        if why is None and row is not None and row.part == "network":
            why = _sharing(hosts, placement, nnodes, node, fault.kind, getattr(fault, "peers", None))
        if why is not None:
            raise FaultRefused(entry.describe(), why)  # the description names the node
